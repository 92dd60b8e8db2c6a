//! The tasks hyper spawns for one client connection (HTTP/2 runs the
//! connection and each stream's body as tasks of their own), held so that
//! none outlives what owns the connection: dropping the [`AbortOnDrop`]
//! aborts them all, and any spawned after that is never started.

use std::future::Future;
use std::sync::{Arc, Mutex};

/// An executor for hyper that keeps a handle on each task it starts.
#[derive(Clone, Default)]
pub(crate) struct ConnTasks(Arc<Mutex<TaskList>>);

#[derive(Default)]
struct TaskList {
    closed: bool,
    handles: Vec<tokio::task::AbortHandle>,
}

impl<F> hyper::rt::Executor<F> for ConnTasks
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, fut: F) {
        let mut list = self.0.lock().unwrap_or_else(|e| e.into_inner());
        // A task spawned while the connection is being torn down is never
        // started.
        if !list.closed {
            list.handles.retain(|h| !h.is_finished());
            list.handles.push(tokio::spawn(fut).abort_handle());
        }
    }
}

/// Aborts the tasks of a [`ConnTasks`] when dropped.
pub(crate) struct AbortOnDrop(pub(crate) ConnTasks);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        let mut list = self.0.0.lock().unwrap_or_else(|e| e.into_inner());
        list.closed = true;
        for handle in list.handles.drain(..) {
            handle.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn dropping_aborts_every_task_and_refuses_new_ones() {
        let tasks = ConnTasks::default();
        let guard = AbortOnDrop(tasks.clone());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        hyper::rt::Executor::execute(&tasks, async move {
            let _tx = tx;
            std::future::pending::<()>().await;
        });
        drop(guard);
        // The task was aborted: its end of the channel is gone.
        assert!(rx.await.is_err());
        let (tx, mut rx) = tokio::sync::oneshot::channel::<()>();
        hyper::rt::Executor::execute(&tasks, async move {
            let _ = tx.send(());
        });
        tokio::task::yield_now().await;
        assert!(rx.try_recv().is_err(), "a task after the drop never runs");
    }
}
