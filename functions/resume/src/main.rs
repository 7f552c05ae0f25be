//! Placeholder until the Lambda handler lands; the engine it will call lives in `shared`.
fn main() {}
