//! The sandbox as the agent and the `sonde` command configure and run it:
//! the `sandbox:` keys, compile budgets, names, plugin text on the
//! command line. The sandbox's own contract is in sonde-sandbox's tests.

mod compile_budget;
mod containment;
mod keys;
mod names;
mod plugin_text;
