//! Tests for `keen::prompt`.
use super::*;
