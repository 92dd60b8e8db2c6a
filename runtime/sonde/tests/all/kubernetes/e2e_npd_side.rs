//! node-problem-detector itself beside sonde, on a real API server: NPD's
//! binary (`SONDE_NPD_BIN`, built by scripts/kube.sh's `ensure_npd`) and
//! the agent run the same monitor files from NPD's module
//! (`SONDE_NPD_DIR`) — its example custom plugin monitor with its
//! `check_ntp.sh`, its `kernel-monitor.json` on the kernel's `/dev/kmsg`,
//! its `docker-monitor-filelog.json` on a file and its `systemd-monitor.json`
//! on a journal (the `logPath` of each the one change: a file of the
//! test's, the journal of a systemd-journald the test starts) — each
//! writing to a Node of its own; the test writes the same lines to
//! `/dev/kmsg`, the file and the journal, then compares
//! the conditions (type, status, reason, message) and the Events (type,
//! reason, message) on the two Nodes. Without a server it is skipped as
//! the other e2e suites are; with one, a missing NPD fails it unless
//! `SONDE_SKIP_NPD=<reason>` says why it may not run.

use super::e2e::client;
use k8s_openapi::api::core::v1::{Event, Node};
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

const PATIENCE: Duration = Duration::from_secs(90);
/// The condition types of the three monitors.
const TYPES: [&str; 4] = ["NTPProblem", "KernelDeadlock", "XfsShutdown", "CperHardwareErrorFatal"];

/// NPD's binary and module files, or `None` when `SONDE_SKIP_NPD` says why
/// not (a missing one fails the test otherwise).
fn npd() -> Option<(PathBuf, PathBuf)> {
    let bin = std::env::var_os("SONDE_NPD_BIN").map(PathBuf::from);
    let dir = std::env::var_os("SONDE_NPD_DIR").map(PathBuf::from);
    if let (Some(bin), Some(dir)) = (&bin, &dir)
        && bin.is_file()
        && dir.join("config").is_dir()
    {
        return Some((bin.clone(), dir.clone()));
    }
    if let Ok(reason) = std::env::var("SONDE_SKIP_NPD") {
        eprintln!("SKIPPED e2e_npd_beside_sonde: SONDE_SKIP_NPD says: {reason}");
        return None;
    }
    panic!(
        "e2e_npd_beside_sonde: node-problem-detector is missing (SONDE_NPD_BIN={bin:?}, SONDE_NPD_DIR={dir:?}): \
         eval \"$(scripts/kube.sh)\" builds it, or SONDE_SKIP_NPD=<reason> skips this suite"
    );
}

/// What a Node shows of the monitors: its conditions of [`TYPES`] as
/// (type, status, reason, message), and its Events as (type, reason,
/// message).
type Seen = (
    BTreeMap<String, (String, String, String)>,
    BTreeSet<(String, String, String)>,
);

async fn seen(client: &kube::Client, node: &str) -> Seen {
    let nodes: Api<Node> = Api::all(client.clone());
    let n = nodes.get(node).await.expect("get the Node");
    let conditions = n
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .filter(|c| TYPES.contains(&c.type_.as_str()))
        .map(|c| {
            let fields = (c.status, c.reason.unwrap_or_default(), c.message.unwrap_or_default());
            (c.type_, fields)
        })
        .collect();
    let events: Api<Event> = Api::all(client.clone());
    let events = events
        .list(&ListParams::default().fields(&format!("involvedObject.name={node}")))
        .await
        .expect("list the Node's Events")
        .items
        .into_iter()
        .map(|e| {
            (
                e.type_.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                e.message.unwrap_or_default(),
            )
        })
        .collect();
    (conditions, events)
}

/// Waits until `done` holds of what both Nodes show; returns that.
async fn until(client: &kube::Client, nodes: [&str; 2], what: &str, done: impl Fn(&Seen) -> bool) -> [Seen; 2] {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let both = [seen(client, nodes[0]).await, seen(client, nodes[1]).await];
        if both.iter().all(&done) {
            return both;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}: NPD's Node {both0:#?}\nsonde's Node {both1:#?}",
            both0 = both[0],
            both1 = both[1]
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// NPD's binary on `node`, from NPD's directory: its custom plugin and
/// kernel monitors and the test's `logs` (the file's and the journal's).
fn start_npd(
    bin: &Path,
    dir: &Path,
    kubeconfig: &Path,
    server: &str,
    node: &str,
    logs: [&Path; 2],
) -> std::process::Child {
    let filelog = logs[0];
    let config = dir.join("config");
    std::process::Command::new(bin)
        .current_dir(dir)
        .arg(format!(
            "--apiserver-override={server}?inClusterConfig=false&auth={}",
            kubeconfig.display()
        ))
        .arg(format!("--hostname-override={node}"))
        .args(["--port=0", "--prometheus-port=0"])
        .arg(format!(
            "--config.custom-plugin-monitor={}",
            config.join("custom-plugin-monitor.json").display()
        ))
        .arg(format!(
            "--config.system-log-monitor={},{},{}",
            config.join("kernel-monitor.json").display(),
            filelog.display(),
            logs[1].display()
        ))
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(filelog.with_extension("npd.log")).unwrap())
        .spawn()
        .expect("start node-problem-detector")
}

async fn run(kubeconfig: &Path, bin: &Path, npd_dir: &Path) {
    let client = client(kubeconfig).await;
    let nodes: Api<Node> = Api::all(client.clone());
    let id = fastrand::u32(..);
    let names = [format!("npd-side-{id}-npd"), format!("npd-side-{id}-sonde")];
    for name in &names {
        super::e2e_npd::create_node(&nodes, name).await;
    }
    let dir = tempfile::tempdir().unwrap();
    // NPD's docker-monitor-filelog.json, its logPath a file of this test's.
    let docker_log = dir.path().join("docker.log");
    std::fs::write(&docker_log, "").unwrap();
    let shipped = std::fs::read_to_string(npd_dir.join("config/docker-monitor-filelog.json")).unwrap();
    assert!(shipped.contains("\"/var/log/docker.log\""));
    let filelog = dir.path().join("docker-monitor-filelog.json");
    std::fs::write(
        &filelog,
        shipped.replace(
            "\"/var/log/docker.log\"",
            &format!("{:?}", docker_log.display().to_string()),
        ),
    )
    .unwrap();

    // NPD's systemd-monitor.json, its logPath the journal of a journald of
    // the test's (a journal namespace: the host's journal is not touched).
    let journal = sonde_tests::journald::Journald::start().expect("systemd-journald (Debian's systemd, as root)");
    let shipped = std::fs::read_to_string(npd_dir.join("config/systemd-monitor.json")).unwrap();
    assert!(shipped.contains("\"/var/log/journal\""));
    let journald = dir.path().join("systemd-monitor.json");
    let dir_json = format!("{:?}", journal.dir.display().to_string());
    std::fs::write(&journald, shipped.replace("\"/var/log/journal\"", &dir_json)).unwrap();

    let mut npd = start_npd(
        bin,
        npd_dir,
        kubeconfig,
        &server(kubeconfig),
        &names[0],
        [filelog.as_path(), journald.as_path()],
    );
    let config = format!(
        "node_problem_detector:\n  - config: {custom}\n    workdir: {npd}\n    exec: [{plugin}]\n  - config: {kernel}\n  - config: {filelog}\n  - config: {journald}\n",
        custom = npd_dir.join("config/custom-plugin-monitor.json").display(),
        npd = npd_dir.display(),
        plugin = npd_dir.join("config/plugin").display(),
        kernel = npd_dir.join("config/kernel-monitor.json").display(),
        filelog = filelog.display(),
        journald = journald.display(),
    );
    let settings = crate::kubernetes::node_settings(&names[1], Duration::from_secs(60), 50.0);
    let (agent, controller) =
        crate::kubernetes::start_gates(client.clone(), dir.path(), &config, settings, false).await;
    let names = [names[0].as_str(), names[1].as_str()];

    // Both have started: every condition is there.
    until(&client, names, "the monitors' conditions", |(c, _)| {
        c.len() == TYPES.len()
    })
    .await;

    // The same lines for both: the kernel's log and the docker log.
    let tag = format!("sonde{id}");
    let kernel = [
        format!("Killed process {id} ({tag}) total-vm:1024kB, anon-rss:0kB, file-rss:0kB, shmem-rss:0kB"),
        format!("task docker:{tag} blocked for more than 120 seconds."),
        format!("XFS ({tag}): Shutting down filesystem"),
    ];
    {
        use std::io::Write;
        let mut kmsg = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/kmsg")
            .expect("write /dev/kmsg (as root)");
        for line in &kernel {
            kmsg.write_all(format!("<4>{line}\n").as_bytes()).unwrap();
        }
        let mut log = std::fs::OpenOptions::new().append(true).open(&docker_log).unwrap();
        let now = k8s_openapi::jiff::Zoned::now()
            .strftime("%Y-%m-%dT%H:%M:%S%.f%:z")
            .to_string();
        writeln!(
            log,
            "time=\"{now}\" level=error msg=\"Error trying v2 registry: failed to register layer: rename /var/lib/docker/image/{tag}/a /var/lib/docker/image/{tag}/b: directory not empty\""
        )
        .unwrap();
    }
    journal.send(
        "systemd",
        &format!("Started kubelet.service - Kubernetes kubelet {tag}."),
    );
    // A temporary rule's Event quotes its line; a condition's says what it
    // became, which may be an earlier line of the 5 minutes looked back.
    let has = |events: &BTreeSet<(String, String, String)>, reason: &str| {
        let tagged = !matches!(reason, "DockerHung" | "XfsHasShutdown");
        events
            .iter()
            .any(|(_, r, m)| r == reason && (!tagged || m.contains(&tag)))
    };
    let [on_npd, on_sonde] = until(&client, names, "the injected lines' conditions and Events", |(c, e)| {
        c.get("XfsShutdown").is_some_and(|x| x.0 == "True")
            && c.get("KernelDeadlock").is_some_and(|x| x.0 == "True")
            && [
                "OOMKilling",
                "TaskHung",
                "DockerHung",
                "XfsHasShutdown",
                "CorruptDockerImage",
            ]
            .iter()
            .all(|r| has(e, r))
    })
    .await;
    let _ = npd.kill();
    let _ = npd.wait();
    controller.stop();
    agent.stop().await;
    for name in names {
        let _ = nodes.delete(name, &DeleteParams::default()).await;
    }
    eprintln!(
        "e2e npd beside sonde: {} conditions and {} distinct Events on NPD's Node, {} and {} on sonde's",
        on_npd.0.len(),
        on_npd.1.len(),
        on_sonde.0.len(),
        on_sonde.1.len()
    );
    assert_eq!(
        on_npd.0, on_sonde.0,
        "the conditions (type -> status, reason, message): NPD's, then sonde's"
    );
    let only_npd: Vec<_> = on_npd.1.difference(&on_sonde.1).collect();
    let only_sonde: Vec<_> = on_sonde.1.difference(&on_npd.1).collect();
    assert!(
        only_npd.is_empty() && only_sonde.is_empty(),
        "the Events differ: only NPD's {only_npd:#?}\nonly sonde's {only_sonde:#?}"
    );
}

/// The server URL of `kubeconfig`.
fn server(kubeconfig: &Path) -> String {
    let text = std::fs::read_to_string(kubeconfig).unwrap();
    text.lines()
        .find_map(|l| l.trim().strip_prefix("server:"))
        .expect("a server in the kubeconfig")
        .trim()
        .to_string()
}

/// Against a real API server: runs only with `SONDE_E2E_KUBECONFIG`, and
/// needs NPD (`SONDE_NPD_BIN`, `SONDE_NPD_DIR`) and root (`/dev/kmsg`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_npd_beside_sonde_on_npds_own_monitors() {
    let Some(path) = crate::support::kube::e2e_kubeconfig(
        "e2e_npd_beside_sonde_on_npds_own_monitors",
        "the CRDs of deploy/kubernetes/crd.yaml installed",
    ) else {
        return;
    };
    let Some((bin, dir)) = npd() else { return };
    run(&path, &bin, &dir).await;
}
