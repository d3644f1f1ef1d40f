//! A spawned task owned by whatever holds it: dropping the owner aborts the task.

/// A task that lives as long as its owner (a replication subscription, a live response's
/// body), and no longer.
pub struct OwnedTask(tokio::task::JoinHandle<()>);

impl OwnedTask {
    pub fn spawn(task: impl std::future::Future<Output = ()> + Send + 'static) -> OwnedTask {
        OwnedTask(tokio::spawn(task))
    }
}

impl Drop for OwnedTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}
