//! Typed ids of everything that crosses a process: a run id is never passed where a task id is
//! expected. Each is `#[serde(transparent)]`, so on the wire and on disk it is the string (or,
//! for [`Attempt`], the number) it replaced.

use std::fmt;

use serde::{Deserialize, Serialize};

macro_rules! id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub String);

        impl $name {
            pub fn as_str(&self) -> &str {
                &self.0
            }
            pub fn is_empty(&self) -> bool {
                self.0.is_empty()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<String> for $name {
            fn from(s: String) -> Self {
                $name(s)
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                $name(s.to_string())
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

id!(
    /// A run: one execution of a task, kept across its attempts.
    RunId
);
id!(
    /// A task: one unit of work submitted to a deployment.
    TaskId
);
id!(
    /// An instance: one `agen instance` process of a deployment, placed on a Nest.
    InstanceId
);
id!(
    /// A Nest: the id it joined with (`agen-nest://<id>` in its certificate).
    NestId
);
id!(
    /// A deployment, by its name within its namespace.
    DeploymentRef
);
id!(
    /// One tool call of a run (the model's call id): what an approval decides.
    CallId
);

/// A run's attempt: 1 for the first, one more for each resume elsewhere.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Attempt(pub u32);

impl Attempt {
    /// The first attempt of a run.
    pub const FIRST: Attempt = Attempt(1);

    pub fn get(self) -> u32 {
        self.0
    }
}

impl fmt::Display for Attempt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl From<u32> for Attempt {
    fn from(n: u32) -> Self {
        Attempt(n)
    }
}

impl From<Attempt> for u32 {
    fn from(a: Attempt) -> Self {
        a.0
    }
}
