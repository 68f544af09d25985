//! Tests for `keen::dispatch`.
use super::*;
