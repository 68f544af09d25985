//! Tests for `keen::registry`.
use super::*;
