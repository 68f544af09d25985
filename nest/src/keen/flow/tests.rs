//! Tests for `keen::flow`.
use super::*;
