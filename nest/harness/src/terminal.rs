//! The approver of `agen run`: asks on the controlling terminal (`y/N`, showing the tool and its
//! arguments), one question at a time. Without a terminal every `ask` call is denied with
//! "no one to approve (standalone, not a terminal)".

use std::io::{BufRead, BufReader, IsTerminal, Write};

use tokio::sync::Mutex;

use crate::run::{ApprovalDecision, ApprovalRequest, Approver};

/// What a call that needs approval gets when `agen run` has no terminal.
pub const NO_TERMINAL: &str = "no one to approve (standalone, not a terminal)";

/// Asks on `/dev/tty` when stdin is a terminal.
#[derive(Default)]
pub struct TerminalApprover {
    /// One question at a time.
    asking: Mutex<()>,
}

#[async_trait::async_trait]
impl Approver for TerminalApprover {
    async fn decide(&self, request: &ApprovalRequest) -> ApprovalDecision {
        let _one = self.asking.lock().await;
        if !std::io::stdin().is_terminal() {
            return ApprovalDecision::Denied(NO_TERMINAL.into());
        }
        let request = request.clone();
        tokio::task::spawn_blocking(move || ask_tty(&request))
            .await
            .unwrap_or_else(|e| {
                ApprovalDecision::Denied(format!("the approval prompt failed: {e}"))
            })
    }
}

fn ask_tty(request: &ApprovalRequest) -> ApprovalDecision {
    let Ok(tty) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
    else {
        return ApprovalDecision::Denied(NO_TERMINAL.into());
    };
    let mut out = match tty.try_clone() {
        Ok(t) => t,
        Err(_) => return ApprovalDecision::Denied(NO_TERMINAL.into()),
    };
    let arguments =
        serde_json::to_string_pretty(&request.arguments).unwrap_or_else(|_| "{}".into());
    let asked = write!(
        out,
        "\nagen run: the agent wants to call {} with arguments:\n{arguments}\nallow this call? [y/N] ",
        request.tool
    )
    .and_then(|_| out.flush());
    if asked.is_err() {
        return ApprovalDecision::Denied(NO_TERMINAL.into());
    }
    let mut line = String::new();
    if BufReader::new(tty).read_line(&mut line).is_err() {
        return ApprovalDecision::Denied(NO_TERMINAL.into());
    }
    match line.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" => ApprovalDecision::Approved,
        _ => ApprovalDecision::Denied("denied by a person at the terminal".into()),
    }
}
