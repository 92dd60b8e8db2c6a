//! Optional persistence of probe state in an embedded database (redb), so a
//! restarted agent does not reset readiness. Writes happen on a thread of
//! their own, batched, so the scheduler never waits on the disk. A file
//! that cannot be opened is moved aside and the agent starts clean.

use super::Persisted;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc;

const PROBES: TableDefinition<&str, &[u8]> = TableDefinition::new("probes");

/// The file name of the state database inside `state_dir`.
pub(crate) const FILE_NAME: &str = "state.redb";

/// Why the state directory could not be used at all.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The directory could not be created.
    #[error("state_dir {dir}: {source}")]
    Dir {
        /// The directory.
        dir: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Another process (another agent) has the state file open.
    #[error("state file {file} is in use by another process (is another sonde running with this state_dir?)")]
    InUse {
        /// The file.
        file: PathBuf,
    },
    /// Even a fresh database could not be created.
    #[error("state file {file}: {source}")]
    Create {
        /// The file.
        file: PathBuf,
        /// What redb (or the writer thread's start) said.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

pub(super) enum Write {
    Put(String, Vec<u8>),
    Delete(String),
    Flush(mpsc::Sender<()>),
}

/// An open state database and its writer thread; dropping it waits for the
/// writes queued so far and closes the file.
pub(super) struct Store {
    pub(super) tx: mpsc::Sender<Write>,
    writer: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Store {
    fn drop(&mut self) {
        // Closing the channel ends the writer once it has written the rest.
        let (tx, _) = mpsc::channel();
        drop(std::mem::replace(&mut self.tx, tx));
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

/// What opening the state database found.
pub(super) struct Opened {
    pub(super) store: Store,
    pub(super) restored: HashMap<String, Persisted>,
    /// Set when the old file was unreadable and moved aside.
    pub(super) moved_aside: Option<(PathBuf, Unreadable)>,
}

/// Why the state database could not be read (it is then moved aside).
#[derive(Debug, thiserror::Error)]
pub(super) enum Unreadable {
    /// redb could not open or read it.
    #[error("{0}")]
    Database(#[from] redb::Error),
    /// A record is not what this version writes.
    #[error("record {key}: {source}")]
    Record {
        /// The probe it is kept under.
        key: String,
        /// What is wrong with it.
        source: serde_json::Error,
    },
}

fn load(db: &Database) -> Result<HashMap<String, Persisted>, Unreadable> {
    let txn = db.begin_read().map_err(redb::Error::from)?;
    let table = match txn.open_table(PROBES) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(HashMap::new()),
        Err(e) => return Err(redb::Error::from(e).into()),
    };
    let mut out = HashMap::new();
    for entry in table.iter().map_err(redb::Error::from)? {
        let (k, v) = entry.map_err(redb::Error::from)?;
        let record: Persisted = serde_json::from_slice(v.value()).map_err(|source| Unreadable::Record {
            key: k.value().to_string(),
            source,
        })?;
        out.insert(k.value().to_string(), record);
    }
    Ok(out)
}

pub(super) fn open(dir: &Path) -> Result<Opened, StoreError> {
    std::fs::create_dir_all(dir).map_err(|source| StoreError::Dir {
        dir: dir.to_path_buf(),
        source,
    })?;
    let file = dir.join(FILE_NAME);
    let attempt = match Database::create(&file) {
        Err(redb::DatabaseError::DatabaseAlreadyOpen) => return Err(StoreError::InUse { file }),
        Err(e) => Err(Unreadable::Database(e.into())),
        Ok(db) => load(&db).map(|r| (db, r)),
    };
    let (db, restored, moved_aside) = match attempt {
        Ok((db, restored)) => (db, restored, None),
        Err(why) => {
            let stamp = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let aside = dir.join(format!("{FILE_NAME}.corrupt-{stamp}"));
            let _ = std::fs::rename(&file, &aside);
            let db = Database::create(&file).map_err(|e| StoreError::Create {
                file: file.clone(),
                source: e.into(),
            })?;
            (db, HashMap::new(), Some((aside, why)))
        }
    };
    let (tx, rx) = mpsc::channel();
    let writer = std::thread::Builder::new()
        .name("sonde-state".into())
        .spawn(move || writer(db, rx))
        .map_err(|e| StoreError::Create { file, source: e.into() })?;
    Ok(Opened {
        store: Store {
            tx,
            writer: Some(writer),
        },
        restored,
        moved_aside,
    })
}

/// Writes batches until every sender is gone.
fn writer(db: Database, rx: mpsc::Receiver<Write>) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        batch.extend(rx.try_iter().take(4096));
        let mut acks = Vec::new();
        let result = (|| -> Result<(), redb::Error> {
            let txn = db.begin_write()?;
            {
                let mut table = txn.open_table(PROBES)?;
                for w in batch {
                    match w {
                        Write::Put(k, v) => {
                            table.insert(k.as_str(), v.as_slice())?;
                        }
                        Write::Delete(k) => {
                            table.remove(k.as_str())?;
                        }
                        Write::Flush(ack) => acks.push(ack),
                    }
                }
            }
            txn.commit()?;
            Ok(())
        })();
        if let Err(e) = result {
            tracing::error!(error = %e, "cannot write probe state");
        }
        for ack in acks {
            let _ = ack.send(());
        }
    }
}
