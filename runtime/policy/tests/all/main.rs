//! sonde-policy's contract tests: the rules with no runtime in them, under
//! seeded fuzzing. One binary, a module per area.

mod fuzz;
