//! The `metaroce` command-line tool.
fn main() {}
