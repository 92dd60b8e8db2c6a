//! The built-in plugins, each against the real server it checks.

mod dns;
mod exec;
mod file_age;
mod grpc;
mod http;
mod icmp;
mod postgres;
mod redis;
mod tcp;
mod tls;
mod tls_cert;
mod tls_starttls;
