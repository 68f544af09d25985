//! The agen command.
fn main() {}
