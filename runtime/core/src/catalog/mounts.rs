//! Which directories may be granted as `files`: never a pseudo-filesystem
//! (procfs, sysfs, devtmpfs, …) nor a directory that holds one, whatever
//! the path is spelt like (`/proc`, a symlink to it, `/` above it, a bind
//! mount of it elsewhere). The filesystem type is read from the kernel's
//! mount table and `statfs`, not guessed from the path.

use std::path::{Path, PathBuf};

/// Filesystem types through which a plugin could read or reach the agent
/// itself or the kernel.
const PSEUDO: &[&str] = &[
    "proc",
    "sysfs",
    "devtmpfs",
    "devpts",
    "debugfs",
    "tracefs",
    "securityfs",
    "cgroup",
    "cgroup2",
    "bpf",
    "configfs",
    "pstore",
    "efivarfs",
    "fusectl",
    "mqueue",
    "binfmt_misc",
    "nsfs",
    "selinuxfs",
    "rpc_pipefs",
    "autofs",
    "hugetlbfs",
];

/// `statfs` magic numbers of the worst of them, for a machine whose mount
/// table cannot be read.
const PROC_SUPER_MAGIC: i64 = 0x9fa0;
const SYSFS_MAGIC: i64 = 0x6265_6572;

/// The pseudo-filesystem at or under `dir` (its mount point and type), if
/// there is one.
pub fn pseudo_within(dir: &Path) -> Option<(PathBuf, String)> {
    let dir = std::fs::canonicalize(dir).ok()?;
    if let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") {
        let mounts = parse_mountinfo(&table);
        // The filesystem `dir` itself is on: the longest mount point above it.
        let own = mounts
            .iter()
            .filter(|(at, _)| dir.starts_with(at))
            .max_by_key(|(at, _)| at.as_os_str().len());
        if let Some((_, fstype)) = own
            && PSEUDO.contains(&fstype.as_str())
        {
            return Some((dir.clone(), fstype.clone()));
        }
        if let Some((at, fstype)) = mounts
            .iter()
            .find(|(at, fstype)| at.starts_with(&dir) && at != &dir && PSEUDO.contains(&fstype.as_str()))
        {
            return Some((at.clone(), fstype.clone()));
        }
    }
    let magic = rustix::fs::statfs(&dir).ok()?.f_type as i64;
    match magic {
        PROC_SUPER_MAGIC => Some((dir, "proc".into())),
        SYSFS_MAGIC => Some((dir, "sysfs".into())),
        _ => None,
    }
}

/// (mount point, filesystem type) of each line of a `mountinfo` table.
fn parse_mountinfo(table: &str) -> Vec<(PathBuf, String)> {
    table
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mount = left.split(' ').nth(4)?;
            let fstype = right.split(' ').next()?;
            Some((PathBuf::from(unescape(mount)), fstype.to_string()))
        })
        .collect()
}

/// Undoes the table's octal escapes (`\040` is a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agents_own_pseudo_filesystems_are_found_however_spelt() {
        assert_eq!(pseudo_within(Path::new("/proc")).map(|p| p.1).as_deref(), Some("proc"));
        assert_eq!(
            pseudo_within(Path::new("/proc/self")).map(|p| p.1).as_deref(),
            Some("proc")
        );
        assert_eq!(pseudo_within(Path::new("/sys")).map(|p| p.1).as_deref(), Some("sysfs"));
        // Through a symlink.
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("p");
        std::os::unix::fs::symlink("/proc", &link).unwrap();
        assert_eq!(pseudo_within(&link).map(|p| p.1).as_deref(), Some("proc"));
        // A directory above one holds it.
        let (mount, fstype) = pseudo_within(Path::new("/")).unwrap();
        assert!(PSEUDO.contains(&fstype.as_str()), "{fstype}");
        assert_ne!(mount, Path::new("/"));
        // An ordinary directory is fine.
        assert_eq!(pseudo_within(dir.path()), None);
    }

    #[test]
    fn mountinfo_lines_and_escapes_are_read() {
        let t = "22 1 0:21 / /proc rw,nosuid - proc proc rw\n30 1 8:1 / /srv/my\\040data rw - ext4 /dev/sda1 rw\n";
        assert_eq!(
            parse_mountinfo(t),
            [
                (PathBuf::from("/proc"), "proc".to_string()),
                (PathBuf::from("/srv/my data"), "ext4".to_string())
            ]
        );
    }
}
