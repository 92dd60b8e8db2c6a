//! sonde's integration tests: one binary, a module per area.

mod agent;
mod api;
mod bench;
mod cli;
mod config_cases;
mod exec;
mod file_age;
mod first_contact;
mod grpc;
mod http;
mod kubernetes;
mod kubernetes_e2e;
mod oci;
mod postgres;
mod redis;
mod registry;
mod sandbox;
mod scaffold;
mod scheduler;
mod signing;
mod support;
mod tcp;
mod tenancy;
mod tenant_api;
mod tls;
mod tls_cert;
