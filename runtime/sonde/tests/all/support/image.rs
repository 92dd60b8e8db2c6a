//! The agent's container image as the tests build it: the shipped
//! Containerfile's `FROM scratch` stage, rebuilt around the binary under
//! test — `sonde` at `/usr/local/bin/sonde`, the shared libraries it links
//! and the CA certificates (what the shipped base image adds), and nothing
//! else, with the Containerfile's `ENTRYPOINT`. `podman import` makes it;
//! a real node's containerd takes it from `podman save`.

use std::path::Path;
use std::process::{Command, Stdio};

/// The shipped Containerfile's `ENTRYPOINT` line.
fn entrypoint() -> String {
    let path = crate::support::repo().join("deploy/kubernetes/Containerfile");
    let containerfile = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    containerfile
        .lines()
        .find(|l| l.starts_with("ENTRYPOINT "))
        .expect("the Containerfile's ENTRYPOINT")
        .to_string()
}

/// The image's files: `bin` as `/usr/local/bin/sonde`, what `ldd` says it
/// loads, and the system's CA roots.
fn root_of(bin: &Path) -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let put = |from: &Path, at: &Path| {
        let to = root.path().join(at.strip_prefix("/").unwrap());
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(from, &to).unwrap_or_else(|e| panic!("{}: {e}", from.display()));
    };
    put(bin, Path::new("/usr/local/bin/sonde"));
    // As the shipped base image has them: the agent's clients (the API
    // server's, OCI registries') load the system's roots.
    let roots = Path::new("/etc/ssl/certs/ca-certificates.crt");
    put(roots, roots);
    let ldd = Command::new("ldd").arg(bin).output().expect("ldd runs");
    assert!(ldd.status.success(), "ldd {}", bin.display());
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)" or
        // "/lib64/ld-linux-x86-64.so.2 (0x…)"; not "linux-vdso.so.1 (0x…)".
        let path = line.split("=>").last().unwrap().split_whitespace().next().unwrap_or("");
        if path.starts_with('/') {
            put(Path::new(path), Path::new(path));
        }
    }
    root
}

/// The image of `bin`, imported into podman as `tag`.
pub(crate) fn podman_import(podman: &Path, bin: &Path, tag: &str) {
    let root = root_of(bin);
    let mut tar = Command::new("tar")
        .arg("-C")
        .arg(root.path())
        .args(["-cf", "-", "."])
        .stdout(Stdio::piped())
        .spawn()
        .expect("tar runs");
    let imported = Command::new(podman)
        .args(["import", "--quiet", "--change", &entrypoint(), "-", tag])
        .stdin(tar.stdout.take().unwrap())
        .output()
        .expect("podman runs");
    assert!(tar.wait().unwrap().success(), "tar of the image's root failed");
    assert!(
        imported.status.success(),
        "podman import: {}",
        String::from_utf8_lossy(&imported.stderr)
    );
}

/// The image of `bin`, as `tag`, in the `k8s.io` namespace of the
/// containerd listening on `socket` (where the kubelet finds it without
/// pulling): made by podman, saved as an archive, imported by `ctr`, and
/// removed from podman again.
pub(crate) fn containerd_import(podman: &Path, ctr: &Path, socket: &Path, bin: &Path, tag: &str) {
    podman_import(podman, bin, tag);
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("image.tar");
    let run = |command: &mut Command| {
        let out = command.output().expect("runs");
        assert!(
            out.status.success(),
            "{command:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(Command::new(podman)
        .args(["save", "--quiet", "--format", "docker-archive", "-o"])
        .arg(&archive)
        .arg(tag));
    let _ = Command::new(podman).args(["rmi", "--force", tag]).output();
    run(Command::new(ctr)
        .arg("--address")
        .arg(socket)
        .args(["--namespace", "k8s.io", "images", "import", "--no-unpack"])
        .arg(&archive));
}
