//! The Agen Hub.
