//! Work whose cost grows with a request's size, such as parsing a large JSON body. Once the
//! input is large it runs on a blocking thread: on an async worker it would hold that worker,
//! and every connection the worker serves, for as long as it takes (about a second for 64 MiB
//! of JSON messages).

/// Inputs up to this size are handled where they are: below it, handing them over costs more
/// than it saves.
pub const INLINE_MAX_BYTES: usize = 1 << 20;

/// Runs `work`, whose input is `bytes` long, in place or on a blocking thread by its size.
pub async fn by_size<T: Send + 'static>(
    bytes: usize,
    work: impl FnOnce() -> T + Send + 'static,
) -> T {
    if bytes <= INLINE_MAX_BYTES {
        return work();
    }
    match tokio::task::spawn_blocking(work).await {
        Ok(done) => done,
        Err(error) => match error.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            // Cancelled: only when the runtime shuts down, which drops this task too.
            Err(_) => std::future::pending().await,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn large_work_leaves_the_async_worker_free_and_small_work_stays_in_place() {
        let worker = std::thread::current().id();
        let small = by_size(INLINE_MAX_BYTES, || std::thread::current().id()).await;
        assert_eq!(small, worker);
        let large = by_size(INLINE_MAX_BYTES + 1, || std::thread::current().id()).await;
        assert_ne!(large, worker);
    }
}
