//! sonde's integration tests: one binary, a module per area.

// An agent's start, awaited inside a test's own future, nests deeper than
// the compiler's default of 128 when it lays the test's future out.
#![recursion_limit = "256"]

mod abuse;
mod agent;
mod api;
mod backend;
mod bench;
mod bounds;
mod catalog;
mod cli;
mod compile_budget;
mod config_cases;
mod containment;
mod crash;
mod examples;
mod exec;
mod file_age;
mod first_contact;
mod fuzz;
mod grpc;
mod http;
mod instance_pool;
mod kubernetes;
mod kubernetes_e2e;
mod kubernetes_namespaces;
mod kubernetes_status;
mod names;
mod oci;
mod oci_hostile;
mod plugin_text;
mod postgres;
mod prometheus;
mod redis;
mod sandbox;
mod sandbox_keys;
mod scaffold;
mod scheduler;
mod shipped_install;
mod signing;
mod support;
mod tcp;
mod tenancy;
mod tenant_api;
mod tls;
mod tls_cert;
