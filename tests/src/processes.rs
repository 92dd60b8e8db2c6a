//! Real programs a test starts: a child process killed on drop, with the
//! log it writes, and a real nginx.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A process this test started, killed when the test ends however it ends.
pub struct Running {
    /// The process.
    pub child: Child,
    /// What it is, for messages.
    pub what: &'static str,
    /// The file it logs to.
    pub log: PathBuf,
}

impl Running {
    /// What it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A real nginx (Debian's `nginx`) in `dir` with `server`, the `http`
/// block's server (or servers).
pub fn start_nginx_serving(dir: &Path, server: &str) -> Running {
    let d = dir.display();
    let conf = dir.join("nginx.conf");
    std::fs::write(
        &conf,
        format!(
            "daemon off;\nmaster_process off;\npid {d}/nginx.pid;\nerror_log {d}/nginx.log;\n\
             events {{ worker_connections 64; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n\
               fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
               {server}}}\n"
        ),
    )
    .unwrap();
    let bin = ["/usr/sbin/nginx", "/usr/bin/nginx"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("nginx (Debian package nginx; scripts/test installs it)");
    let log = dir.join("nginx.log");
    let child = Command::new(bin)
        .arg("-p")
        .arg(dir)
        .arg("-c")
        .arg(&conf)
        .arg("-e")
        .arg(&log)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start nginx");
    Running {
        child,
        what: "nginx",
        log,
    }
}
