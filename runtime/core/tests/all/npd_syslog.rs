//! node-problem-detector's system-log monitor on real sources: lines
//! written to a followed file and to the kernel's `/dev/kmsg` (as root)
//! become the Events and conditions NPD would make, in NPD's words. Each
//! test's lines carry a tag of their own, so tests running at once (and
//! whatever else writes to the kernel's log) do not see each other's.

use sonde_core::catalog::npd::LogMonitor;
use sonde_core::config::{LogBounds, NpdFile};
use sonde_core::npd::syslog::LineOutcome;
use sonde_core::npd::{ConditionStatus, Report, Severity, Sink};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// A sink that hands each report on, with its source.
struct Reports(mpsc::UnboundedSender<(String, Report)>);

impl Sink for Reports {
    fn report(&self, source: &str, report: &Report) {
        let _ = self.0.send((source.to_string(), report.clone()));
    }
    fn line(&self, _: &str, _: LineOutcome) {}
}

/// The monitor file `json`, written in `dir`, read and running; its
/// reports come out of the receiver.
fn start(dir: &Path, json: &str) -> (tokio::task::JoinHandle<()>, mpsc::UnboundedReceiver<(String, Report)>) {
    let file = dir.join("monitor.json");
    std::fs::write(&file, json).unwrap();
    let NpdFile::Log(monitor) = NpdFile::read(&file, dir).unwrap() else {
        panic!("not a system-log monitor")
    };
    let monitor = Arc::new(LogMonitor {
        file,
        monitor,
        bounds: LogBounds::default(),
    });
    let (tx, rx) = mpsc::unbounded_channel();
    (
        tokio::spawn(sonde_core::npd::syslog::run(monitor, Arc::new(Reports(tx)))),
        rx,
    )
}

/// The next report (10 s at most).
async fn next(rx: &mut mpsc::UnboundedReceiver<(String, Report)>) -> Report {
    let (source, report) = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("a report within 10s")
        .expect("the monitor runs");
    assert_eq!(source, "test-monitor");
    report
}

fn event(severity: Severity, reason: &str, message: &str) -> Report {
    Report::Event {
        severity,
        reason: reason.into(),
        message: message.into(),
    }
}

/// The rules each test's monitor has, its lines tagged `tag`: a
/// temporary one, a permanent one, and a two-line one.
fn rules(tag: &str) -> String {
    format!(
        r#""conditions": [{{"type": "TestDeadlock", "reason": "NoDeadlock", "message": "no deadlock"}}],
  "rules": [
    {{"type": "temporary", "reason": "OOMKilling", "pattern": "{tag} Stopped probe \\d+ \\(.+\\) total-vm:\\d+kB.*"}},
    {{"type": "permanent", "condition": "TestDeadlock", "reason": "DockerHung", "pattern": "{tag} probe docker:\\w+ stalled for more than \\w+ seconds\\."}},
    {{"type": "temporary", "reason": "TwoLines", "pattern": "{tag} first\\n{tag} second", "patternGeneratedMessageSuffix": "see the runbook"}}
  ]"#
    )
}

/// What the test's lines make, whatever the source.
async fn expect_npds_reports(rx: &mut mpsc::UnboundedReceiver<(String, Report)>, tag: &str) {
    match next(rx).await {
        Report::Event {
            severity,
            reason,
            message,
        } => {
            assert_eq!((severity, reason.as_str()), (Severity::Warning, "OOMKilling"));
            assert_eq!(
                message,
                format!("{tag} Stopped probe 42 (stress) total-vm:1024kB, anon-rss:0kB")
            );
        }
        other => panic!("{other:?}"),
    }
    let Report::Condition(c) = next(rx).await else {
        panic!("a condition")
    };
    assert_eq!(
        (c.kind.as_str(), c.status, c.reason.as_str(), c.message.as_str()),
        (
            "TestDeadlock",
            ConditionStatus::True,
            "DockerHung",
            format!("{tag} probe docker:abc stalled for more than 120 seconds.").as_str()
        )
    );
    assert_eq!(
        next(rx).await,
        event(
            Severity::Warning,
            "DockerHung",
            &format!(
                "Node condition TestDeadlock is now: True, reason: DockerHung, message: \"{tag} probe docker:abc stalled for more than 120 seconds.\""
            )
        )
    );
    assert_eq!(
        next(rx).await,
        event(
            Severity::Warning,
            "TwoLines",
            &format!("{tag} first\n{tag} second; see the runbook")
        ),
        "both lines, and the rule's suffix"
    );
}

/// The lines each test writes, tagged.
fn lines(tag: &str) -> Vec<String> {
    vec![
        format!("{tag} Stopped probe 42 (stress) total-vm:1024kB, anon-rss:0kB"),
        format!("{tag} probe docker:abc stalled for more than 120 seconds."),
        // The same reason again: no change, no Event.
        format!("{tag} probe docker:def stalled for more than 120 seconds."),
        format!("{tag} first"),
        format!("{tag} second"),
    ]
}

async fn expect_defaults(rx: &mut mpsc::UnboundedReceiver<(String, Report)>) {
    let Report::Condition(c) = next(rx).await else {
        panic!("the default first")
    };
    assert_eq!(
        (c.kind.as_str(), c.status, c.reason.as_str(), c.message.as_str()),
        ("TestDeadlock", ConditionStatus::False, "NoDeadlock", "no deadlock")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lines_appended_to_a_file_become_npds_events_and_condition() {
    let dir = tempfile::tempdir().unwrap();
    let tag = format!("sonde-test-{}", fastrand::u32(..));
    let log = dir.path().join("kern.log");
    // An old line (before the 5 minutes looked back) and one with no
    // timestamp the file's pattern finds: neither is matched.
    let old = jiff::Zoned::now()
        .checked_sub(jiff::SignedDuration::from_hours(1))
        .unwrap();
    std::fs::write(
        &log,
        format!(
            "{} host kernel: [1.0] {tag} Stopped probe 1 (old) total-vm:1kB\nno time here\n",
            old.strftime("%b %e %H:%M:%S")
        ),
    )
    .unwrap();
    let (task, mut rx) = start(
        dir.path(),
        &format!(
            r#"{{"plugin": "filelog",
  "pluginConfig": {{"timestamp": "^.{{15}}", "message": "kernel: \\[.*\\] (.*)", "timestampFormat": "Jan _2 15:04:05"}},
  "logPath": "{}", "lookback": "5m", "bufferSize": 10, "source": "test-monitor",
  {}}}"#,
            log.display(),
            rules(&tag)
        ),
    );
    expect_defaults(&mut rx).await;
    let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    for line in lines(&tag) {
        let now = jiff::Zoned::now().strftime("%b %e %H:%M:%S").to_string();
        std::io::Write::write_all(&mut f, format!("{now} host kernel: [12.5] {line}\n").as_bytes()).unwrap();
    }
    expect_npds_reports(&mut rx, &tag).await;
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lines_written_to_dev_kmsg_become_npds_events_and_condition() {
    let writable = std::fs::OpenOptions::new().write(true).open("/dev/kmsg");
    let Ok(mut kmsg) = writable else {
        let why = format!("/dev/kmsg cannot be written here: {:?}", writable.err());
        sonde_tests::tools::missing(&why, "run as root");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let tag = format!("sonde-test-{}", fastrand::u32(..));
    let (task, mut rx) = start(
        dir.path(),
        &format!(
            r#"{{"plugin": "kmsg", "logPath": "/dev/kmsg", "lookback": "5m", "bufferSize": 10, "source": "test-monitor", {}}}"#,
            rules(&tag)
        ),
    );
    expect_defaults(&mut rx).await;
    // One write, one record. The two-line rule needs its lines one after
    // the other: a record written between them by anyone else would part
    // them (a tagged line cannot be told from it), so they go in one
    // burst as the last.
    for line in lines(&tag) {
        std::io::Write::write_all(&mut kmsg, format!("<4>{line}\n").as_bytes()).unwrap();
    }
    expect_npds_reports(&mut rx, &tag).await;
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_of_a_real_journal_become_npds_events_and_condition() {
    let Some(journal) = sonde_tests::journald::Journald::start() else {
        sonde_tests::tools::missing(
            "systemd-journald could not be started here",
            "apt-get install systemd, as root",
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let tag = format!("sonde-test-{}", fastrand::u32(..));
    let (task, mut rx) = start(
        dir.path(),
        &format!(
            r#"{{"plugin": "journald", "pluginConfig": {{"source": "{tag}"}}, "logPath": "{}", "lookback": "5m", "bufferSize": 10, "source": "test-monitor", {}}}"#,
            journal.dir.display(),
            rules(&tag)
        ),
    );
    expect_defaults(&mut rx).await;
    // Another identifier's entry is not read.
    journal.send("someone-else", &format!("{tag} Stopped probe 1 (other) total-vm:1kB"));
    for line in lines(&tag) {
        journal.send(&tag, &line);
    }
    expect_npds_reports(&mut rx, &tag).await;
    task.abort();
}
