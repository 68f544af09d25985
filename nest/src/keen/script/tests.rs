//! Tests for `keen::script`.
use super::*;
