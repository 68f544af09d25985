//! The names of the built-in tools ([`super::builtins`]), below every module that checks a
//! tool name against them.

pub const BUILTIN_FINISH: &str = "finish";
pub const BUILTIN_LOAD_SKILL: &str = "load_skill";
pub const BUILTIN_REPORT_PROGRESS: &str = "report_progress";
pub const BUILTIN_SAVE_ARTIFACT: &str = "save_artifact";
pub const BUILTIN_READ_ARTIFACT: &str = "read_artifact";

/// Names no MCP tool may take.
pub(super) const BUILTIN_NAMES: [&str; 5] = [
    BUILTIN_FINISH,
    BUILTIN_LOAD_SKILL,
    BUILTIN_REPORT_PROGRESS,
    BUILTIN_SAVE_ARTIFACT,
    BUILTIN_READ_ARTIFACT,
];
