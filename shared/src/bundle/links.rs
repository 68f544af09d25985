//! Symlinks of a bundle archive resolved against the archive's own tree, the way the kernel
//! will resolve them once unpacked.
//!
//! Invariant: an archive is accepted only if every symlink, followed through every other link
//! on its way (`d/l0 -> ..`, `u1 -> d/l0/..`), ends at a regular file or a folder of the
//! bundle without ever climbing above its root. A lexical check of each link alone is not
//! enough: a chain of links that each look harmless can resolve to `/` once unpacked.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::entry::{ArchiveEntry, EntryKind};

/// Links followed while resolving one symlink (the kernel's own limit is 40).
const MAX_HOPS: usize = 40;
/// Path components walked for all links of one archive together, so a crafted archive
/// cannot make validation slow.
const MAX_STEPS: usize = 2_000_000;

#[derive(Clone, Copy)]
enum Node<'a> {
    File,
    Dir,
    Link(&'a str),
}

/// Checks that every symlink in `entries` resolves to a file or folder inside the bundle.
/// The error names the link, its target and why it is refused.
pub(crate) fn check_links(entries: &[ArchiveEntry]) -> Result<(), String> {
    let mut nodes: BTreeMap<&str, Node<'_>> = BTreeMap::new();
    let mut dirs: BTreeSet<&str> = BTreeSet::new();
    for e in entries {
        let node = match e.kind {
            EntryKind::File | EntryKind::Executable => Node::File,
            EntryKind::Symlink => match std::str::from_utf8(&e.data) {
                Ok(t) => Node::Link(t),
                Err(_) => return Err(format!("symlink {}: target is not UTF-8", e.path)),
            },
        };
        nodes.insert(e.path.as_str(), node);
        let mut p = e.path.as_str();
        while let Some((parent, _)) = p.rsplit_once('/') {
            dirs.insert(parent);
            p = parent;
        }
    }
    let lookup = |p: &str| -> Option<Node<'_>> {
        nodes
            .get(p)
            .copied()
            .or_else(|| dirs.contains(p).then_some(Node::Dir))
    };
    let mut steps = 0usize;
    for (path, node) in &nodes {
        if let Node::Link(target) = *node {
            resolve(path, target, &lookup, &mut steps)
                .map_err(|why| format!("symlink {path} -> {target} {why}"))?;
        }
    }
    Ok(())
}

/// Follows the link at `path` (target `target`) component by component.
fn resolve<'a>(
    path: &'a str,
    target: &'a str,
    lookup: &impl Fn(&str) -> Option<Node<'a>>,
    steps: &mut usize,
) -> Result<(), String> {
    const OUTSIDE: &str = "points outside the bundle";
    // Where we are: the components from the root. A link resolves from its own folder.
    let mut at: Vec<&str> = path.split('/').collect();
    at.pop();
    let mut pending: VecDeque<&str> = VecDeque::new();
    let push_target = |pending: &mut VecDeque<&'a str>, t: &'a str| -> Result<(), String> {
        if t.is_empty() || t.starts_with('/') {
            return Err(OUTSIDE.to_string());
        }
        for part in t.split('/').rev() {
            pending.push_front(part);
        }
        Ok(())
    };
    push_target(&mut pending, target)?;
    let mut hops = 1usize;
    let mut via: Option<String> = None;
    while let Some(part) = pending.pop_front() {
        *steps += 1;
        if *steps > MAX_STEPS {
            return Err(format!(
                "needs more than {MAX_STEPS} steps to resolve (with the archive's other links); simplify the links"
            ));
        }
        match part {
            "" | "." => {}
            ".." => {
                if at.pop().is_none() {
                    return Err(match &via {
                        Some(v) => format!("{OUTSIDE} (through {v})"),
                        None => OUTSIDE.to_string(),
                    });
                }
            }
            name => {
                at.push(name);
                let here = at.join("/");
                match lookup(&here) {
                    Some(Node::Dir) => {}
                    Some(Node::File) => {
                        if pending.iter().any(|p| !p.is_empty()) {
                            return Err(format!(
                                "goes through the file {here} as if it were a folder"
                            ));
                        }
                    }
                    Some(Node::Link(next)) => {
                        hops += 1;
                        if hops > MAX_HOPS {
                            return Err(format!(
                                "goes through more than {MAX_HOPS} links (a loop?)"
                            ));
                        }
                        at.pop();
                        *steps += next.split('/').count();
                        via = Some(format!("{here} -> {next}"));
                        push_target(&mut pending, next)?;
                    }
                    None => {
                        return Err(format!(
                            "points to {here}, which is not a file or folder in the bundle"
                        ))
                    }
                }
            }
        }
    }
    Ok(())
}
