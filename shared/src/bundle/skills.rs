//! `skills/<name>/SKILL.md`: skills the agent can load with `load_skill` (or has preloaded).
//!
//! Invariants: every folder under `skills/` holds a `SKILL.md` whose front matter has a
//! non-empty `name` equal to the folder name and a non-empty `description`; skills are sorted
//! by name.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::error::{BundleError, Result};
use super::front_matter;
use super::json::{read_text_optional, Obj};

pub const SKILLS_DIR: &str = "skills";

/// One skill.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skill {
    pub name: String,
    /// Shown in `load_skill`'s description.
    pub description: String,
    /// The body of SKILL.md (what `load_skill` returns).
    pub body: String,
    /// The skill's folder (absolute when the bundle dir is), for files the body refers to.
    pub dir: PathBuf,
}

pub(crate) fn load_all(bundle_dir: &Path) -> Result<Vec<Skill>> {
    let root = bundle_dir.join(SKILLS_DIR);
    let entries = match std::fs::read_dir(&root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(BundleError::io(SKILLS_DIR, "cannot list", e)),
    };
    let mut skills = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| BundleError::io(SKILLS_DIR, "cannot list", e))?;
        let is_dir = std::fs::metadata(entry.path())
            .map(|m| m.is_dir())
            .unwrap_or(false);
        if !is_dir {
            continue; // e.g. skills/README.md
        }
        let folder = entry.file_name().to_string_lossy().into_owned();
        if folder.starts_with('.') {
            continue;
        }
        let file = format!("{SKILLS_DIR}/{folder}/SKILL.md");
        let text = read_text_optional(bundle_dir, &file)?.ok_or_else(|| BundleError::Missing {
            file: file.clone(),
            hint: format!(
                "every folder under skills/ needs a SKILL.md with front matter `name: {folder}` and `description: ...`"
            ),
        })?;
        skills.push(parse(&file, &folder, &text, entry.path())?);
    }
    skills.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(skills)
}

fn parse(file: &str, folder: &str, text: &str, dir: PathBuf) -> Result<Skill> {
    let fm = front_matter::split(file, text)?;
    let holder = Value::Object(fm.fields);
    let obj = Obj::new(file, "", &holder, "front matter fields")?;
    let required = |key: &str| -> Result<String> {
        match obj.opt_str(key)? {
            Some(s) if !s.trim().is_empty() => Ok(s.trim().to_string()),
            _ => Err(obj.err(key, format!("missing; a SKILL.md needs front matter `name: {folder}` and `description: <when to use it>`"))),
        }
    };
    let name = required("name")?;
    let description = required("description")?;
    if name != folder {
        return Err(obj.err(
            "name",
            format!("is `{name}` but the folder is `{folder}`; expected them to be equal"),
        ));
    }
    Ok(Skill {
        name,
        description,
        body: fm.body,
        dir,
    })
}
