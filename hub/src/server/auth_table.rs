//! The authorization table of `AgenService`: one row per RPC, saying what the call needs and
//! where its namespace comes from. It is enforced at the edge, in `auth.rs`: the bearer check
//! every `AgenService` call passes ([`super::auth::ApiAuth`], which sees the RPC's name from
//! [`super::auth::Audited`]) refuses an RPC without a row before any handler runs, and
//! [`super::auth::authorize`], the one check every handler makes, refuses an action the row does
//! not allow (a handler that disagrees with its row fails closed, never open).
//!
//! Invariant: every RPC of `agen.v1.AgenService` has exactly one row, and every row names an
//! RPC of it (the test below reads the RPCs from the proto descriptor, so a new RPC without a
//! row fails it). `docs/permissions.md` says what each action needs.

use crate::tokens::{Need, Role};

/// What a call does, for authorization and the audit log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// list, get, watch, traces, artifacts.
    Read,
    /// submit, cancel.
    Submit,
    /// deploy, delete, secrets.
    Deploy,
    /// bundle uploads (no namespace): deployer somewhere.
    Upload,
    /// tokens and the audit log of a namespace.
    Administer,
    /// read what only the cluster admin may see (Nests).
    ClusterRead,
    /// change what only the cluster admin may change (Nests, join tokens).
    ClusterWrite,
}

impl Action {
    pub(super) fn need(self) -> Need {
        match self {
            Action::Read => Need::Role(Role::Viewer),
            Action::Submit => Need::Role(Role::Submitter),
            Action::Deploy => Need::Role(Role::Deployer),
            Action::Upload => Need::AnyNamespace(Role::Deployer),
            Action::Administer => Need::Role(Role::Admin),
            Action::ClusterRead | Action::ClusterWrite => Need::Cluster,
        }
    }

    pub(super) fn mutating(self) -> bool {
        !matches!(self, Action::Read | Action::ClusterRead)
    }
}

/// What an RPC needs, and where the namespace it is checked against comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// `action` in the request's `namespace` field (empty = `default`).
    Namespace(Action),
    /// Read in the request's `namespace`; with `all_namespaces`, the cluster admin gets every
    /// namespace and a namespace token its own (`auth::list_scope`).
    ListScope,
    /// `action`, which needs no namespace: `Upload` (a deployer anywhere) or the cluster admin.
    Global(Action),
    /// Decided by what the request names (a token's kind, the caller's token): one of
    /// `actions`, as `how` says.
    ByTarget {
        actions: &'static [Action],
        how: &'static str,
    },
}

impl Rule {
    /// Whether a handler's [`super::auth::authorize`] call for `action` keeps to this row.
    pub fn allows(self, action: Action) -> bool {
        match self {
            Rule::Namespace(a) | Rule::Global(a) => a == action,
            Rule::ListScope => action == Action::Read,
            Rule::ByTarget { actions, .. } => actions.contains(&action),
        }
    }
}

use Action::*;
use Rule::*;

const TOKEN_CHANGE: Rule = ByTarget {
    actions: &[Administer, ClusterWrite],
    how: "an API token: Administer in its namespace; a join token: the cluster admin",
};
const TOKEN_LIST: Rule = ByTarget {
    actions: &[Administer, ClusterRead],
    how: "the cluster admin: every token or record; a namespace token: Administer in its own namespace",
};

/// The table: RPC name → rule, in the proto's order.
pub const RPCS: &[(&str, Rule)] = &[
    ("UploadBundle", Global(Upload)),
    ("CreateDeployment", Namespace(Deploy)),
    ("GetDeployment", Namespace(Read)),
    ("ListDeployments", ListScope),
    ("DeleteDeployment", Namespace(Deploy)),
    ("ListInstances", ListScope),
    ("ListNests", Global(ClusterRead)),
    ("SubmitTask", Namespace(Submit)),
    ("GetTask", Namespace(Read)),
    ("QueryTask", Namespace(Read)),
    ("WatchTask", Namespace(Read)),
    ("CancelTask", Namespace(Submit)),
    ("ListTasks", Namespace(Read)),
    ("WatchTasks", Namespace(Read)),
    ("GetTrace", Namespace(Read)),
    ("ListArtifacts", Namespace(Read)),
    ("GetArtifact", Namespace(Read)),
    ("SetSecret", Namespace(Deploy)),
    ("ListSecrets", Namespace(Deploy)),
    ("DeleteSecret", Namespace(Deploy)),
    ("CreateToken", TOKEN_CHANGE),
    ("ListTokens", TOKEN_LIST),
    ("RevokeToken", TOKEN_CHANGE),
    ("RotateToken", TOKEN_CHANGE),
    ("RenameToken", TOKEN_CHANGE),
    ("ListAudit", TOKEN_LIST),
    ("RevokeNest", Global(ClusterWrite)),
    ("ForgetNest", Global(ClusterWrite)),
    ("ScaleDeployment", Namespace(Deploy)),
    ("ListDeploymentHistory", Namespace(Read)),
    ("RollbackDeployment", Namespace(Deploy)),
    ("CordonNest", Global(ClusterWrite)),
    ("UncordonNest", Global(ClusterWrite)),
    ("DrainNest", Global(ClusterWrite)),
    ("ReadLogs", Namespace(Read)),
    ("ListApprovals", Namespace(Read)),
    ("DecideApproval", Namespace(Submit)),
    ("WatchNests", Global(ClusterRead)),
    ("WatchDeployments", ListScope),
    ("SnapshotStore", Global(ClusterWrite)),
    ("VerifyStore", Global(ClusterWrite)),
    ("CreateSchedule", Namespace(Deploy)),
    ("ListSchedules", Namespace(Read)),
    ("PauseSchedule", Namespace(Deploy)),
    ("ResumeSchedule", Namespace(Deploy)),
    ("DeleteSchedule", Namespace(Deploy)),
    ("RunSchedule", Namespace(Submit)),
    ("ListTaskWebhooks", Namespace(Read)),
];

/// The row of an RPC, by its name (`SubmitTask`).
pub fn rule(method: &str) -> Option<Rule> {
    RPCS.iter().find(|(m, _)| *m == method).map(|(_, r)| *r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;
    use std::collections::BTreeSet;

    /// The RPCs of `agen.v1.AgenService`, read from the descriptor the server reflects.
    fn agen_service_rpcs() -> Vec<String> {
        let set = prost_types::FileDescriptorSet::decode(agen_proto::FILE_DESCRIPTOR_SET)
            .expect("the descriptor set decodes");
        let rpcs: Vec<String> = set
            .file
            .iter()
            .filter(|f| f.package() == "agen.v1")
            .flat_map(|f| f.service.iter())
            .filter(|s| s.name() == "AgenService")
            .flat_map(|s| s.method.iter().map(|m| m.name().to_string()))
            .collect();
        assert!(
            rpcs.len() > 30,
            "found only {} AgenService RPCs",
            rpcs.len()
        );
        rpcs
    }

    #[test]
    fn every_rpc_has_exactly_one_row_and_every_row_an_rpc() {
        let rpcs: BTreeSet<String> = agen_service_rpcs().into_iter().collect();
        let rows: Vec<&str> = RPCS.iter().map(|(m, _)| *m).collect();
        let unique: BTreeSet<&str> = rows.iter().copied().collect();
        assert_eq!(unique.len(), rows.len(), "a method has two rows: {rows:?}");
        let missing: Vec<&String> = rpcs.iter().filter(|m| rule(m).is_none()).collect();
        assert!(
            missing.is_empty(),
            "these AgenService RPCs have no row in hub/src/server/auth_table.rs (say what they need; docs/permissions.md): {missing:?}"
        );
        let stale: Vec<&&str> = rows.iter().filter(|m| !rpcs.contains(**m)).collect();
        assert!(
            stale.is_empty(),
            "rows for RPCs the proto does not have: {stale:?}"
        );
    }

    #[test]
    fn a_row_allows_only_its_actions() {
        assert!(Namespace(Read).allows(Read));
        assert!(!Namespace(Read).allows(Submit));
        assert!(ListScope.allows(Read));
        assert!(!ListScope.allows(Deploy));
        assert!(TOKEN_CHANGE.allows(ClusterWrite));
        assert!(!TOKEN_CHANGE.allows(Read));
        assert_eq!(rule("SubmitTask"), Some(Namespace(Submit)));
        assert_eq!(rule("NoSuchRpc"), None);
    }
}
