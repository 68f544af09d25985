//! Attack tests of the bundle archive and of validation reads: link chains that resolve
//! outside once unpacked, links to devices, FIFOs and oversized files, each refused with the
//! file named.

use std::path::Path;
use std::time::{Duration, Instant};

use super::*;

const AGENT_MD: &str = "---\nmodel: openai/gpt-4.1-mini\n---\nYou are helpful.\n";

fn entry(path: &str, kind: EntryKind, data: &str) -> ArchiveEntry {
    ArchiveEntry {
        path: path.into(),
        kind,
        data: data.as_bytes().to_vec(),
    }
}
fn file(path: &str, data: &str) -> ArchiveEntry {
    entry(path, EntryKind::File, data)
}
fn link(path: &str, target: &str) -> ArchiveEntry {
    entry(path, EntryKind::Symlink, target)
}

/// `entries` (sorted here) are refused by `decode` and `unpack` with an error containing
/// `expected`, and nothing is left on disk.
#[track_caller]
fn refused(mut entries: Vec<ArchiveEntry>, expected: &str) {
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    let bytes = encode(&entries).unwrap();
    let err = decode(&bytes).unwrap_err().to_string();
    assert!(err.contains(expected), "expected {expected:?}, got {err}");
    let out = tempfile::tempdir().unwrap();
    let err = unpack(&bytes, &out.path().join("b"))
        .unwrap_err()
        .to_string();
    assert!(err.contains(expected), "expected {expected:?}, got {err}");
    assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 0);
}

#[track_caller]
fn accepted(mut entries: Vec<ArchiveEntry>) {
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    let bytes = encode(&entries).unwrap();
    let out = tempfile::tempdir().unwrap();
    let into = out.path().join("b");
    unpack(&bytes, &into).unwrap();
    Bundle::load(&into).unwrap();
}

#[test]
#[rustfmt::skip] // one attack per line reads as a table
fn link_chains_that_leave_the_bundle_once_unpacked_are_refused() {
    let agent = || file("x-agen/agent.md", AGENT_MD);
    // The reported chain: each link alone looks inside, together they reach `/`.
    refused(vec![agent(), file("d/f", ""), link("d/l0", ".."), link("u1", "d/l0/..")],
        "symlink u1 -> d/l0/.. points outside the bundle (through d/l0 -> ..)");
    refused(vec![file("d/e/f", ""), link("d/e/l0", "../.."), link("d/l1", "e/l0/.."), link("x-agen", "d/l1/etc")],
        "points outside the bundle");
    refused(vec![agent(), file("a/b/c", ""), link("a/b/up", "../.."), link("a/b/up2", "up/.."), link("dev", "a/b/up2/dev/zero")],
        "points outside the bundle");
    // Links to what is not in the bundle, loops, links through files.
    refused(vec![agent(), link("zero", "dev/zero")], "symlink zero -> dev/zero points to dev, which is not a file or folder in the bundle");
    refused(vec![agent(), link("a", "b"), link("b", "a")], "goes through more than 40 links (a loop?)");
    refused(vec![agent(), link("self", "self/x")], "goes through more than 40 links");
    refused(vec![agent(), file("f", "x"), link("l", "f/x")], "symlink l -> f/x goes through the file f as if it were a folder");
    refused(vec![agent(), link("l", "")], "symlink l ->  points outside the bundle");
    refused(vec![agent(), file("d/f", ""), link("d/abs", "/d/f")], "symlink d/abs -> /d/f points outside the bundle");
}

#[test]
fn links_to_files_and_folders_inside_the_bundle_still_work() {
    let agent = || file("x-agen/agent.md", AGENT_MD);
    accepted(vec![
        agent(),
        file("lib/a.py", "a"),
        link("skills/s/a.py", "../../lib/a.py"),
        link("libdir", "lib"),
        link("chain", "libdir/a.py"),
        link("here", "."),
        link("lib/up", "../lib/./a.py"),
        file("skills/s/SKILL.md", "---\nname: s\ndescription: d\n---\n"),
    ]);
}

#[test]
#[cfg(unix)]
fn pack_refuses_a_local_link_chain_that_leaves_the_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("b");
    std::fs::create_dir_all(root.join("x-agen")).unwrap();
    std::fs::create_dir_all(root.join("d")).unwrap();
    std::fs::write(root.join("x-agen/agent.md"), AGENT_MD).unwrap();
    std::os::unix::fs::symlink("..", root.join("d/l0")).unwrap();
    std::os::unix::fs::symlink("d/l0/..", root.join("u1")).unwrap();
    let err = pack(&root).unwrap_err().to_string();
    assert!(
        err.contains("symlink u1 -> d/l0/.. points outside the bundle (through d/l0 -> ..); a link must lead to a file or folder inside the bundle: copy the file into the bundle instead"),
        "{err}"
    );
}

/// A bundle folder on disk whose `x-agen/agent.md` is whatever `make` puts there.
fn load_with_agent(make: impl FnOnce(&Path)) -> (Duration, String) {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("b");
    std::fs::create_dir_all(root.join("x-agen")).unwrap();
    make(&root.join("x-agen/agent.md"));
    let started = Instant::now();
    let err = Bundle::load(&root).unwrap_err().to_string();
    (started.elapsed(), err)
}

#[test]
#[cfg(target_os = "linux")]
fn validation_refuses_devices_fifos_outside_links_and_oversized_files_naming_the_file() {
    let (took, err) = load_with_agent(|p| std::os::unix::fs::symlink("/dev/zero", p).unwrap());
    assert!(
        err.starts_with("x-agen/agent.md: leads outside the bundle"),
        "{err}"
    );
    assert!(took < Duration::from_secs(2), "{took:?}");

    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("agent.md"), AGENT_MD).unwrap();
    let target = outside.path().join("agent.md");
    let (_, err) = load_with_agent(|p| std::os::unix::fs::symlink(&target, p).unwrap());
    assert!(
        err.starts_with("x-agen/agent.md: leads outside the bundle"),
        "{err}"
    );

    let (took, err) = load_with_agent(|p| {
        nix::unistd::mkfifo(p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap()
    });
    assert!(
        err.starts_with("x-agen/agent.md: is not a regular file"),
        "{err}"
    );
    assert!(
        took < Duration::from_secs(2),
        "a FIFO must not block: {took:?}"
    );

    let (_, err) = load_with_agent(|p| {
        let f = std::fs::File::create(p).unwrap();
        f.set_len(MAX_FILE_BYTES + 1).unwrap();
    });
    assert_eq!(
        err,
        "x-agen/agent.md: is larger than 4 MiB; expected a small text file (keep data out of the bundle's definition files)"
    );
}
