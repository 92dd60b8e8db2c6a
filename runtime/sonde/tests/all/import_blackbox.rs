//! `sonde modules import`: blackbox_exporter's own example configs (as
//! Debian ships them) and small files of our own, through the real binary,
//! and its output through the real `sonde validate`.

use crate::support::sonde;
use std::path::{Path, PathBuf};
use std::process::Output;

const EXAMPLES: &str = "/usr/share/doc/prometheus-blackbox-exporter/examples";

/// One of the example files of Debian's prometheus-blackbox-exporter;
/// `None` (the test is skipped, and says so) when the package is not
/// installed, unless `SONDE_REQUIRE_TOOLS` is set (scripts/test sets it).
fn debian_example(name: &str) -> Option<PathBuf> {
    let path = Path::new(EXAMPLES).join(name);
    if path.is_file() {
        return Some(path);
    }
    let what = format!("{} is missing", path.display());
    sonde_tests::tools::missing(&what, "apt-get install prometheus-blackbox-exporter");
    None
}

/// A file of blackbox_exporter 0.28's Go module, in the module cache
/// scripts/tools.sh fills (`go mod download`); `None` (skipped) when it is
/// not there, unless `SONDE_REQUIRE_TOOLS` is set.
fn blackbox_028(name: &str) -> Option<PathBuf> {
    let cache = std::env::var_os("SONDE_TOOLS_CACHE").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/sonde/tools"),
        PathBuf::from,
    );
    let path = cache
        .join("go/mod/github.com/prometheus/blackbox_exporter@v0.28.0")
        .join(name);
    if path.is_file() {
        return Some(path);
    }
    let what = format!("{} is missing", path.display());
    sonde_tests::tools::missing(
        &what,
        "run scripts/tools.sh (it downloads blackbox_exporter 0.28's module)",
    );
    None
}

/// The key paths the import refused, in order, from its stderr.
fn refused(file: &Path, out: &Output) -> Vec<String> {
    let prefix = format!("sonde: {}:", file.display());
    stderr(out)
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .filter_map(|l| l.split(": ").nth(1).map(str::to_string))
        .filter(|path| path.starts_with("modules."))
        .collect()
}

fn import(file: &Path, extra: &[&str]) -> Output {
    let file = file.to_str().unwrap();
    sonde(&[&["modules", "import", file, "--grant", "10.0.0.0/8:*"][..], extra].concat())
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The import's output as a sonde config file, checked by `sonde
/// validate`; the file's modules as JSON.
fn validated(dir: &Path, out: &Output) -> serde_json::Value {
    assert_eq!(out.status.code(), Some(0), "{}", stderr(out));
    let yaml = String::from_utf8(out.stdout.clone()).unwrap();
    assert!(
        yaml.starts_with("# sonde modules imported from the blackbox_exporter config "),
        "{yaml}"
    );
    let config = dir.join("sonde.yaml");
    std::fs::write(&config, &yaml).unwrap();
    let check = sonde(&["validate", config.to_str().unwrap()]);
    assert_eq!(check.status.code(), Some(0), "{}\n{yaml}", stderr(&check));
    let file = sonde_core::config::parse(&config, &yaml).unwrap();
    let modules: serde_json::Map<String, serde_json::Value> = file
        .modules
        .iter()
        .map(|(name, m)| {
            let config = m.config.as_ref().map_or(serde_json::json!({}), |c| c.value.clone());
            let value = serde_json::json!({
                "plugin": m.plugin.value,
                "timeout": m.timeout.as_ref().map(|t| humantime::format_duration(t.value.0).to_string()),
                "config": config,
                "net": m.grants.net.iter().map(|g| g.value.clone()).collect::<Vec<_>>(),
                "files": m.grants.files.iter().map(|g| g.value.display().to_string()).collect::<Vec<_>>(),
            });
            (name.clone(), value)
        })
        .collect();
    serde_json::Value::Object(modules)
}

/// What `example.yml` has that sonde cannot honour, by key path.
const EXAMPLE_UNSUPPORTED: &[&str] = &[
    "modules.http_with_proxy.http.proxy_url: not supported",
    "modules.http_with_proxy.http.skip_resolve_phase_with_proxy: true is not supported",
    "modules.icmp_example.icmp.source_ip_address: not supported",
];

#[test]
fn blackbox_exporters_example_is_refused_naming_each_unsupported_option() {
    let Some(example) = debian_example("example.yml") else {
        return;
    };
    let out = import(&example, &[]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(out.stdout.is_empty(), "nothing on stdout: {out:?}");
    let err = stderr(&out);
    for named in EXAMPLE_UNSUPPORTED {
        assert!(err.contains(named), "{named} is not named:\n{err}");
    }
    // Each with the file, line and column: the icmp module's source address.
    let icmp = format!(
        "{}:120:26: modules.icmp_example.icmp.source_ip_address:",
        example.display()
    );
    assert!(err.contains(&icmp), "{icmp}\n{err}");
    assert!(err.contains("--skip-unsupported leaves them out"), "{err}");
    // What maps is not named.
    for mapped in [
        "http_post_2xx",
        "tls_connect",
        "tcp_connect_example",
        "fail_if_body_matches_regexp",
    ] {
        assert!(!err.contains(mapped), "{mapped} is named:\n{err}");
    }
}

#[test]
fn blackbox_exporters_example_imports_with_skip_unsupported_and_validates() {
    let Some(example) = debian_example("example.yml") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = import(&example, &["--skip-unsupported"]);
    let err = stderr(&out);
    for named in EXAMPLE_UNSUPPORTED {
        assert!(err.contains(&format!("skipped: {}", example.display())), "{err}");
        assert!(err.contains(named), "{named} is not listed as skipped:\n{err}");
    }
    let modules = validated(dir.path(), &out);
    let names: Vec<&str> = modules.as_object().unwrap().keys().map(String::as_str).collect();
    // The modules without a prober or a step sonde lacks; the custom-CA
    // one only where its CA's directory exists.
    let mut expected = vec![
        "dns_soa",
        "dns_tcp_example",
        "dns_udp_example",
        "http_2xx_example",
        "http_basic_auth_example",
        "http_gzip",
        "http_gzip_with_accept_encoding",
        "http_post_2xx",
        "http_with_proxy",
        "icmp_example",
        "imap_starttls",
        "irc_banner_example",
        "smtp_starttls",
        "tcp_connect_example",
        "tls_connect",
    ];
    if Path::new("/certs").is_dir() {
        expected.insert(5, "http_custom_ca_example");
    } else {
        assert!(
            err.contains("modules.http_custom_ca_example.http.tls_config.ca_file: /certs: not a directory"),
            "{err}"
        );
    }
    assert_eq!(names, expected);
    assert_eq!(
        modules["icmp_example"]["config"],
        serde_json::json!({"preferred_ip_protocol": "ip4"})
    );
    assert_eq!(modules["dns_soa"]["plugin"], "dns");
    assert_eq!(
        modules["dns_soa"]["config"],
        serde_json::json!({"query_name": "prometheus.io", "query_type": "SOA"})
    );
    assert_eq!(
        modules["dns_udp_example"]["config"]["validate_answer_rrs"]["fail_if_all_match_regexp"],
        serde_json::json!([".*127.0.0.1"])
    );
    let post = &modules["http_post_2xx"];
    assert_eq!(post["plugin"], "http");
    assert_eq!(post["timeout"], "5s");
    assert_eq!(post["net"], serde_json::json!(["10.0.0.0/8:*"]));
    assert_eq!(
        post["config"],
        serde_json::json!({"method": "POST", "headers": {"Content-Type": "application/json"}, "body": "{}", "expected_status": ["200-299"]})
    );
    let web = &modules["http_2xx_example"]["config"];
    assert_eq!(web["headers"]["Host"], "vhost.example.com");
    assert_eq!(web["body_not_regex"], "Could not connect to database");
    assert_eq!(web["body_regex"], "Download the latest version here");
    assert_eq!(
        web["header_regex"]["Access-Control-Allow-Origin"],
        "(\\*|example\\.com)"
    );
    assert_eq!(
        modules["http_basic_auth_example"]["config"]["headers"]["Authorization"],
        "Basic dXNlcm5hbWU6bXlzZWNyZXQ="
    );
    assert_eq!(modules["tls_connect"]["config"], serde_json::json!({"tls": true}));
    assert_eq!(modules["tcp_connect_example"]["plugin"], "tcp");
    // No timeout in blackbox_exporter: the scrape's deadline governs.
    assert_eq!(modules["http_gzip"]["timeout"], "2m");
}

#[test]
fn blackbox_exporters_shipped_config_imports_with_skip_unsupported_and_validates() {
    let Some(shipped) = debian_example("blackbox.yml") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // Nothing refused; the IP-version preference becomes the module's grant.
    let out = import(&shipped, &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("ip_protocol: ip4"),
        "the grpc module's preference:\n{text}"
    );
    let modules = validated(dir.path(), &out);
    assert_eq!(
        modules["grpc_plain"]["config"],
        serde_json::json!({"service": "service1"})
    );
    assert_eq!(modules["grpc"]["config"], serde_json::json!({"tls": true}));
    assert_eq!(
        modules["pop3s_banner"]["config"],
        serde_json::json!({"tls": true, "steps": [{"expect": "(?mR)^+OK"}]})
    );
    assert_eq!(
        modules["ssh_banner"]["config"]["steps"],
        serde_json::json!([{"expect": "(?mR)^SSH-2.0-"}, {"send": "SSH-2.0-blackbox-ssh-check\n"}])
    );
    assert_eq!(
        modules["http_2xx"]["config"],
        serde_json::json!({"expected_status": ["200-299"]})
    );
    assert_eq!(modules["icmp"]["plugin"], "icmp");
    assert_eq!(modules["icmp_ttl5"]["config"], serde_json::json!({"ttl": 5}));
    assert_eq!(
        modules["irc_banner"]["config"]["steps"][3],
        serde_json::json!({"send_expand": "PONG ${1}\n"})
    );
}

#[test]
fn each_prober_maps_and_validates_with_every_grant() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    std::fs::create_dir(&certs).unwrap();
    let bb = dir.path().join("blackbox.yml");
    std::fs::write(
        &bb,
        format!(
            r#"modules:
  https_api:
    prober: http
    timeout: 3s
    http:
      valid_status_codes: [200, 401]
      method: HEAD
      fail_if_body_matches_regexp: [panic, "stack trace"]
      fail_if_header_not_matches: [{{header: Content-Type, regexp: json}}]
      tls_config: {{ca_file: {ca}, server_name: api.internal}}
      bearer_token: t0ken
  redis:
    prober: tcp
    tcp:
      query_response: [{{send: PING}}, {{expect: "^\\+PONG$"}}]
  grpc_tls:
    prober: grpc
    timeout: 1s
    grpc: {{service: health, tls: true, tls_config: {{insecure_skip_verify: true}}}}
"#,
            ca = certs.join("ca.pem").display()
        ),
    )
    .unwrap();
    let out = sonde(&[
        "modules",
        "import",
        bb.to_str().unwrap(),
        "--grant",
        "10.0.0.0/8:*",
        "--grant",
        "*.internal:443",
    ]);
    let modules = validated(dir.path(), &out);
    let grants = serde_json::json!(["10.0.0.0/8:*", "*.internal:443"]);
    let api = &modules["https_api"];
    assert_eq!(api["net"], grants);
    assert_eq!(api["files"], serde_json::json!([certs.display().to_string()]));
    assert_eq!(
        api["config"],
        serde_json::json!({
            "method": "HEAD",
            "expected_status": [200, 401],
            "body_not_regex": "(?:panic)|(?:stack trace)",
            "header_regex": {"Content-Type": "json"},
            "ca_file": certs.join("ca.pem").display().to_string(),
            "server_name": "api.internal",
            "headers": {"Authorization": "Bearer t0ken"},
        })
    );
    assert!(stderr(&out).contains("note: modules.https_api.http.bearer_token: written as an Authorization header"));
    assert_eq!(
        modules["redis"]["config"],
        serde_json::json!({"steps": [{"send": "PING\n"}, {"expect": "(?mR)^\\+PONG$"}]})
    );
    assert_eq!(
        modules["grpc_tls"]["config"],
        serde_json::json!({"service": "health", "tls": true, "insecure_skip_verify": true})
    );
    assert_eq!(modules["grpc_tls"]["timeout"], "1s");
}

#[test]
fn bad_input_is_refused_with_nothing_on_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let bb = dir.path().join("blackbox.yml");
    let write = |text: &str| std::fs::write(&bb, text).unwrap();

    // A key blackbox_exporter would refuse: an error, --skip-unsupported or not.
    write("modules:\n  a:\n    prober: http\n    http:\n      methd: GET\n  b:\n    prober: ftp\n");
    for extra in [&[][..], &["--skip-unsupported"][..]] {
        let out = import(&bb, extra);
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        assert!(out.stdout.is_empty(), "{out:?}");
        let err = stderr(&out);
        assert!(
            err.contains(&format!("{}:5:7: modules.a.http.methd: unknown key", bb.display())),
            "{err}"
        );
        assert!(err.contains("modules.b.prober: unknown prober \"ftp\""), "{err}");
    }

    // Broken YAML, with its place.
    write("modules:\n  a: [\n");
    let out = import(&bb, &[]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(stderr(&out).contains(&format!("{}:", bb.display())), "{out:?}");

    // A grant sonde's parser refuses, named with its value; none at all.
    write("modules:\n  a:\n    prober: tcp\n");
    let bad = sonde(&["modules", "import", bb.to_str().unwrap(), "--grant", "10.0.0.0/33:*"]);
    assert_eq!(bad.status.code(), Some(3), "{bad:?}");
    assert!(stderr(&bad).contains("--grant: net grant \"10.0.0.0/33:*\""), "{bad:?}");
    assert!(bad.stdout.is_empty());
    let none = sonde(&["modules", "import", bb.to_str().unwrap()]);
    assert_eq!(none.status.code(), Some(2), "{none:?}");
    assert!(stderr(&none).contains("--grant"), "{none:?}");

    // A file that is not there.
    let missing = sonde(&["modules", "import", "/nonexistent/blackbox.yml", "--grant", "*:*"]);
    assert_eq!(missing.status.code(), Some(3), "{missing:?}");
}

#[test]
fn every_flag_of_modules_import_is_documented() {
    use clap::CommandFactory;
    let cli = sonde::cli::Cli::command();
    let import = cli
        .find_subcommand("modules")
        .and_then(|m| m.find_subcommand("import"))
        .expect("sonde modules import");
    let doc = std::fs::read_to_string(crate::support::repo().join("docs/prometheus.md")).unwrap();
    let table: Vec<&str> = doc
        .lines()
        .skip_while(|l| !l.starts_with("### Migrating from blackbox_exporter"))
        .skip_while(|l| !l.starts_with("| flag |"))
        .take_while(|l| l.starts_with('|'))
        .collect();
    let readme = std::fs::read_to_string(crate::support::repo().join("README.md")).unwrap();
    let synopsis = readme
        .lines()
        .find(|l| l.starts_with("sonde modules import "))
        .expect("README.md's synopsis has sonde modules import");
    let mut documented = 0;
    for arg in import.get_arguments().filter(|a| !a.is_global_set()) {
        let name = match (arg.get_long(), arg.get_value_names()) {
            (Some("help"), _) => continue,
            (Some(long), _) => format!("--{long}"),
            (None, Some(names)) => names[0].to_string(),
            (None, None) => continue,
        };
        assert!(
            table.iter().any(|row| row.starts_with(&format!("| `{name}"))),
            "{name} is not in docs/prometheus.md's flag table of sonde modules import: {table:?}"
        );
        if name.starts_with("--") {
            assert!(
                synopsis.contains(&name),
                "{name} is not in README.md's synopsis: {synopsis}"
            );
        }
        documented += 1;
    }
    assert_eq!(documented, 3);
}

#[test]
fn an_imported_query_response_talks_as_blackbox_exporter_would() {
    use std::io::{BufRead, BufReader, Write};
    // A server that greets with two lines, then answers the line it reads.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.write_all(b"* hello\r\n+OK ready\r\n").unwrap();
        let mut line = String::new();
        BufReader::new(s.try_clone().unwrap()).read_line(&mut line).unwrap();
        s.write_all(format!("got {}\r\n", line.trim_end()).as_bytes()).unwrap();
        line
    });
    let dir = tempfile::tempdir().unwrap();
    let bb = dir.path().join("blackbox.yml");
    // blackbox_exporter matches each line alone (so ^ and $ are a line's
    // ends, before its \r\n) and ends each send with a newline.
    std::fs::write(
        &bb,
        "modules:\n  banner:\n    prober: tcp\n    tcp:\n      query_response:\n        - expect: '^\\+OK ready$'\n        - send: QUIT\n        - expect: '^got QUIT$'\n",
    )
    .unwrap();
    let modules = validated(dir.path(), &import(&bb, &[]));
    let config = modules["banner"]["config"].to_string();
    let out = sonde(&["check", "tcp", "--target", &addr, "--config", &config]);
    assert_eq!(out.status.code(), Some(0), "{config}: {out:?}");
    assert_eq!(server.join().unwrap(), "QUIT\n");
}

/// What 0.28's `example.yml` has that sonde refuses, each argued in
/// docs/prometheus.md's table (a file this machine lacks included).
const EXAMPLE_028_REFUSED: &[&str] = &[
    "modules.http_with_proxy.http.proxy_url",
    "modules.http_with_proxy.http.skip_resolve_phase_with_proxy",
    "modules.http_with_proxy_and_headers.http.proxy_url",
    "modules.http_with_proxy_and_headers.http.proxy_connect_header",
    "modules.http_post_body_file.http.body_file",
    "modules.http_json_cel_match.http.fail_if_body_json_not_matches_cel",
    "modules.http_2xx_oauth_client_credentials.http.oauth2",
    "modules.http_custom_ca_example.http.tls_config.ca_file",
    "modules.rabbitmq.tcp.tls_config.ca_file",
    "modules.rabbitmq_insecure.tcp.tls_config.ca_file",
    "modules.icmp_example.icmp.source_ip_address",
    "modules.unix_socket_ping.prober",
    "modules.http_with_header_from_files.http.http_headers.X-API-Key.files[0]",
];

#[test]
fn blackbox_028s_example_imports_but_for_what_the_docs_argue() {
    let Some(example) = blackbox_028("example.yml") else {
        return;
    };
    let out = import(&example, &[]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert_eq!(refused(&example, &out), EXAMPLE_028_REFUSED, "{}", stderr(&out));
    let dir = tempfile::tempdir().unwrap();
    let modules = validated(dir.path(), &import(&example, &["--skip-unsupported"]));
    let web = &modules["http_2xx_example"]["config"];
    assert_eq!(web["header_not_regex"], serde_json::json!({"Set-Cookie": ".*"}));
    assert_eq!(web["header_allow_missing"], serde_json::json!(["Set-Cookie"]));
    assert_eq!(web["headers"]["Accept-Language"], "en-US");
    assert_eq!(
        modules["irc_banner_example"]["config"]["steps"][2],
        serde_json::json!({"expect": "(?mR)PING :([^ ]+)"})
    );
    assert_eq!(
        modules["irc_banner_example"]["config"]["steps"][3],
        serde_json::json!({"send_expand": "PONG ${1}\n"})
    );
    assert_eq!(
        modules["http_gzip"]["config"]["headers"],
        serde_json::json!({"Accept-Encoding": "gzip"})
    );
    for gone in ["unix_socket_ping", "http_json_cel_match"] {
        assert!(modules.get(gone).is_none(), "{gone}");
    }
    // starttls: the tcp plugin's step of that name, after the entry's send.
    assert_eq!(
        modules["smtp_starttls"]["config"]["steps"],
        serde_json::json!([
            {"expect": "(?mR)^220 ([^ ]+) ESMTP (.+)$"},
            {"send": "EHLO prober\r\n"},
            {"expect": "(?mR)^250-STARTTLS"},
            {"send": "STARTTLS\r\n"},
            {"expect": "(?mR)^220"},
            {"starttls": true},
            {"send": "EHLO prober\r\n"},
            {"expect": "(?mR)^250-AUTH"},
            {"send": "QUIT\r\n"},
        ])
    );
    assert_eq!(
        modules["imap_starttls"]["config"]["steps"][3],
        serde_json::json!({"starttls": true})
    );
    assert_eq!(
        modules["postgresql"]["config"]["steps"],
        serde_json::json!([
            {"send_base64": "AAAACATSFi8K"},
            {"expect_bytes": "S"},
            {"starttls": true},
        ])
    );
}

#[test]
fn blackbox_028s_shipped_config_imports_but_for_what_the_docs_argue() {
    let Some(shipped) = blackbox_028("blackbox.yml") else {
        return;
    };
    let out = import(&shipped, &[]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert_eq!(
        refused(&shipped, &out),
        [
            "modules.ssh_banner_extract.tcp.query_response[0].labels",
            "modules.http_3xx.http.enable_http3",
            "modules.http_3xx.http.valid_http_versions",
        ],
        "{}",
        stderr(&out)
    );
    let dir = tempfile::tempdir().unwrap();
    let modules = validated(dir.path(), &import(&shipped, &["--skip-unsupported"]));
    assert_eq!(
        modules["irc_banner"]["config"]["steps"],
        serde_json::json!([
            {"send": "NICK prober\n"},
            {"send": "USER prober prober prober :prober\n"},
            {"expect": "(?mR)PING :([^ ]+)"},
            {"send_expand": "PONG ${1}\n"},
            {"expect": "(?mR)^:[^ ]+ 001"},
        ])
    );
    assert_eq!(
        modules["ssh_banner_extract"]["config"]["steps"],
        serde_json::json!([{"expect": "(?mR)^SSH-2.0-([^ -]+)(?: (.*))?$"}])
    );
    assert_eq!(
        modules["http_2xx"]["config"],
        serde_json::json!({"expected_status": ["200-299"]})
    );
}

#[test]
fn a_binary_send_and_expect_bytes_import_and_talk_byte_for_byte() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut got = [0u8; 9];
        s.read_exact(&mut got).unwrap();
        s.write_all(b"N").unwrap();
        got
    });
    let dir = tempfile::tempdir().unwrap();
    let bb = dir.path().join("blackbox.yml");
    std::fs::write(
        &bb,
        "modules:\n  pg:\n    prober: tcp\n    tcp:\n      query_response:\n      - send: !!binary AAAACATSFi8=\n      - expect_bytes: S\n",
    )
    .unwrap();
    let modules = validated(dir.path(), &import(&bb, &[]));
    assert_eq!(
        modules["pg"]["config"],
        serde_json::json!({"steps": [{"send_base64": "AAAACATSFi8K"}, {"expect_bytes": "S"}]})
    );
    let config = modules["pg"]["config"].to_string();
    let out = sonde(&["check", "tcp", "--target", &addr, "--config", &config]);
    assert_ne!(out.status.code(), Some(0), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("expected the bytes S, got N"),
        "{out:?}"
    );
    assert_eq!(server.join().unwrap(), [0, 0, 0, 8, 4, 0xd2, 0x16, 0x2f, b'\n']);
}

#[test]
fn credential_files_become_sonde_secrets() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("api-key.txt");
    std::fs::write(&key, "0123456789abcdef\n").unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let bb = dir.path().join("blackbox.yml");
    std::fs::write(
        &bb,
        format!(
            "modules:\n  api:\n    prober: http\n    http:\n      http_headers:\n        X-API-Key:\n          files: [{k}]\n      basic_auth: {{username: u, password_file: {k}}}\n",
            k = key.display()
        ),
    )
    .unwrap();
    let out = import(&bb, &[]);
    let yaml = String::from_utf8_lossy(&out.stdout).into_owned();
    let modules = validated(dir.path(), &out);
    assert_eq!(
        modules["api"]["config"]["headers"],
        serde_json::json!({
            "X-API-Key": "$(secret:api.http.http_headers.x-api-key.files-0-)",
            "Authorization": "Basic $(base64:u:$(secret:api.http.basic_auth.password_file))",
        }),
        "{yaml}"
    );
    assert!(
        yaml.contains(&format!(
            "api.http.basic_auth.password_file: {{file: \"{}\"}}",
            key.display()
        )),
        "{yaml}"
    );
}
