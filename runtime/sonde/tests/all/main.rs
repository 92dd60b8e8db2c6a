//! sonde's integration tests: one binary, a module per area.

// An agent's start, awaited inside a test's own future, nests deeper than
// the compiler's default of 128 when it lays the test's future out.
#![recursion_limit = "256"]

mod abuse;
mod agent;
mod api;
mod bench;
mod blackbox;
mod blackbox_alerts;
mod blackbox_icmp_dns;
mod cli;
mod config_cases;
mod crash;
mod examples;
mod failure_cause;
mod first_contact;
mod fuzz;
mod import_blackbox;
mod kubernetes;
mod npd;
mod npd_syslog;
mod oci;
mod otlp;
mod probes;
mod prometheus;
mod sandbox;
mod scaffold;
mod secrets;
mod shipped_install;
mod signed_uploads;
mod support;
mod tenancy;
mod tenant_api;
