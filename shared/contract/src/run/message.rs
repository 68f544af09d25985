//! Conversation messages, provider-neutral: what a model turn adds, what a conversation's
//! history holds and what `run.finished` hands back (`{"role": "assistant", "content": …,
//! "tool_calls": […]}` on the wire).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub enum Message {
    /// Instructions; usually only in the model request's system prompt, kept for completeness.
    System {
        content: String,
    },
    User {
        content: String,
    },
    Assistant {
        #[serde(default)]
        content: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
    },
    /// The result of one tool call, answering the assistant's call `call_id`.
    Tool {
        call_id: String,
        /// The model-facing tool name (`<server>_<tool>` or a built-in).
        name: String,
        content: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        is_error: bool,
    },
}

impl Message {
    pub fn user(content: impl Into<String>) -> Message {
        Message::User {
            content: content.into(),
        }
    }
    pub fn assistant(content: impl Into<String>) -> Message {
        Message::Assistant {
            content: content.into(),
            tool_calls: Vec::new(),
        }
    }
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// A tool call asked for by the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The provider's call id (made up when the provider gives none).
    pub id: String,
    /// The model-facing tool name.
    pub name: String,
    /// The arguments as parsed JSON (an object, or the raw text as a string when the model
    /// sent arguments that are not JSON): the model's data, not ours.
    pub arguments: Value,
}

/// Token counts, when the provider reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}
