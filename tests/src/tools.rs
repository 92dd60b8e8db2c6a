//! The test's surroundings: the repository's root, the programs a test
//! needs on `PATH`, and the token files an agent reads.

use std::path::PathBuf;

/// The repository's root, found at run time: a test binary reused from
/// another checkout's target dir (the metadata hash of a workspace member
/// leaves its path out) would otherwise look in that checkout.
pub fn repo() -> PathBuf {
    PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo test sets CARGO_MANIFEST_DIR")).join("../..")
}

/// `name`'s path on `PATH`; `None` (the test is skipped, and says so) when
/// it is not installed, unless `SONDE_REQUIRE_TOOLS` is set (scripts/test
/// sets it: in CI a missing tool is a failure).
pub fn tool(name: &str, package: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH")
        .and_then(|path| std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file()));
    if found.is_none() {
        missing(
            &format!("{name} is not installed"),
            &format!("apt-get install {package}"),
        );
    }
    found
}

/// The program at the path in the environment variable `var` (scripts/test
/// exports it after building the program), with [`tool`]'s convention: a
/// test is skipped without it, unless `SONDE_REQUIRE_TOOLS` is set. `what`
/// names the program, `how` says how to get it.
pub fn tool_from_env(var: &str, what: &str, how: &str) -> Option<PathBuf> {
    let found = std::env::var_os(var).map(PathBuf::from).filter(|p| p.is_file());
    if found.is_none() {
        let said = std::env::var(var).map_or_else(|_| format!("{var} is not set"), |v| format!("{var}={v} is no file"));
        missing(&format!("{what} is missing ({said})"), how);
    }
    found
}

/// A missing tool or file a test needs: a failure under
/// `SONDE_REQUIRE_TOOLS`, else a skip that says so (the caller returns).
pub fn missing(what: &str, fix: &str) {
    assert!(std::env::var_os("SONDE_REQUIRE_TOOLS").is_none(), "{what}: {fix}");
    eprintln!("skipped: {what} ({fix}); SONDE_REQUIRE_TOOLS=1 makes this a failure");
}

/// Writes `token` to `dir/name`, readable by its owner only (the agent
/// refuses a world-readable token file).
pub fn secret(dir: &std::path::Path, name: &str, token: &str) {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(dir.join(name))
        .unwrap();
    std::io::Write::write_all(&mut f, token.as_bytes()).unwrap();
}

/// Whether the system gives this process ping sockets: the
/// `net.ipv4.ping_group_range` sysctl covers one of its groups (scripts/test
/// opens it). When it does not, the test is skipped and says so, or fails
/// under `SONDE_REQUIRE_TOOLS`.
pub fn ping_sockets() -> bool {
    let open = socket2::Socket::new(
        socket2::Domain::IPV4,
        socket2::Type::DGRAM,
        Some(socket2::Protocol::ICMPV4),
    )
    .is_ok();
    if !open {
        let range = std::fs::read_to_string("/proc/sys/net/ipv4/ping_group_range").unwrap_or_default();
        assert!(
            std::env::var_os("SONDE_REQUIRE_TOOLS").is_none(),
            "ping sockets are closed (net.ipv4.ping_group_range is {:?}): sysctl -w net.ipv4.ping_group_range='0 2147483647'",
            range.trim()
        );
        eprintln!("skipped: ping sockets are closed (net.ipv4.ping_group_range); scripts/test opens them");
    }
    open
}
