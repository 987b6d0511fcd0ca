//! Connections the inbox keeps between deliveries.
//!
//! sqlx's pool tests every connection it takes back with a round trip to the database (a `Sync` and its
//! `ReadyForQuery`), in a task it spawns for the purpose. On the inbox's apply path that is a fifth round trip
//! after `BEGIN`, the marker insert, the handler's change and `COMMIT`, and the database pays for it as much
//! as the client. The inbox therefore keeps a connection it has just used cleanly (its transaction committed
//! or rolled back without error) for the next delivery instead of handing it back:
//!
//! * only a connection in a known state is kept: any error, a crash simulation or a dropped future hands the
//!   connection back to the pool the usual way, where sqlx tests it;
//! * a kept connection is still checked out of the pool, so the pool's limit bounds the inbox as before; the
//!   inbox keeps at most as many as it had deliveries in flight at once, and never the pool's last one (a
//!   connection is kept only while the pool has another idle or room to open one), so the application and
//!   the inbox's own side work still get a connection without waiting;
//! * a connection kept longer than the idle limit (default 500 ms) goes back to the pool, so an idle consumer
//!   does not hold connections the application needs, and `Pool::close` does not wait on the inbox for more
//!   than about that long; a closed pool gets its connections back at once;
//! * when `BEGIN` fails (a kept or pooled connection died while it waited: the server restarted, say), the
//!   inbox tries once more on a fresh connection from the pool before it reports a store error; nothing
//!   happened in the database, so the second try is safe;
//! * an inbox dropped outside a Tokio runtime closes its kept connections itself (sqlx needs a runtime to
//!   take them back).

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;

use crate::backend::Backend;

/// How often a sweeper looks for connections past the idle limit.
const SWEEP_EVERY: Duration = Duration::from_millis(100);

struct State<DB: Backend> {
    /// Most recently used last.
    idle: Vec<(PoolConnection<DB>, Instant)>,
    /// Whether a sweeper task is running for these connections.
    sweeping: bool,
}

/// Connections kept between deliveries, shared by the clones of one inbox.
pub(crate) struct KeptConnections<DB: Backend> {
    state: Mutex<State<DB>>,
    keep_idle: Duration,
}

impl<DB: Backend> KeptConnections<DB> {
    pub(crate) fn new(keep_idle: Duration) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                idle: Vec::new(),
                sweeping: false,
            }),
            keep_idle,
        })
    }

    pub(crate) fn keep_idle(&self) -> Duration {
        self.keep_idle
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<DB>> {
        // A panic while holding this lock leaves nothing half-done: the Vec is always consistent.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The most recently kept connection that is still fresh, or one from the pool.
    pub(crate) async fn take(
        &self,
        pool: &sqlx::Pool<DB>,
    ) -> Result<PoolConnection<DB>, sqlx::Error> {
        if pool.is_closed() {
            self.release_all();
        } else if !self.keep_idle.is_zero() {
            let (fresh, stale) = {
                let mut st = self.lock();
                let fresh = st.idle.pop();
                let stale = split_stale(&mut st.idle, self.keep_idle);
                (fresh, stale)
            };
            // Stale connections go back to the pool outside the lock (their drop spawns sqlx's check).
            drop(stale);
            if let Some((conn, at)) = fresh {
                if at.elapsed() <= self.keep_idle {
                    return Ok(conn);
                }
            }
        }
        pool.acquire().await
    }

    /// Keeps a connection whose last transaction ended cleanly.
    pub(crate) fn put(self: &Arc<Self>, conn: PoolConnection<DB>, pool: &sqlx::Pool<DB>) {
        if self.keep_idle.is_zero() || pool.is_closed() {
            return;
        }
        // Never take the pool's last connection: someone else (the application, the rejection record, a
        // purge) must still get one at once.
        let spare = pool.num_idle() > 0 || pool.size() < pool.options().get_max_connections();
        if !spare {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            // No runtime to sweep with: hand the connection back.
            return;
        };
        let start_sweeper = {
            let mut st = self.lock();
            st.idle.push((conn, Instant::now()));
            !std::mem::replace(&mut st.sweeping, true)
        };
        if start_sweeper {
            rt.spawn(sweep(Arc::downgrade(self), pool.clone()));
        }
    }

    /// Hands every kept connection back to the pool.
    pub(crate) fn release_all(&self) {
        let all = std::mem::take(&mut self.lock().idle);
        drop(all);
    }

    /// How many connections are kept now.
    pub(crate) fn kept(&self) -> usize {
        self.lock().idle.len()
    }
}

impl<DB: Backend> Drop for KeptConnections<DB> {
    fn drop(&mut self) {
        let idle = std::mem::take(&mut self.lock().idle);
        if tokio::runtime::Handle::try_current().is_ok() {
            // Back to the pool the usual way (sqlx spawns its check).
            drop(idle);
        } else {
            // sqlx needs a runtime to take a connection back; without one, close them here instead.
            for (conn, _) in idle {
                drop(conn.detach());
            }
        }
    }
}

/// Removes the connections idle for longer than `keep_idle` (the oldest are first).
fn split_stale<DB: Backend>(
    idle: &mut Vec<(PoolConnection<DB>, Instant)>,
    keep_idle: Duration,
) -> Vec<(PoolConnection<DB>, Instant)> {
    let now = Instant::now();
    let fresh_from = idle
        .iter()
        .position(|(_, at)| now.duration_since(*at) <= keep_idle)
        .unwrap_or(idle.len());
    idle.drain(..fresh_from).collect()
}

/// Returns connections past the idle limit to the pool until none is kept, then ends.
async fn sweep<DB: Backend>(kept: Weak<KeptConnections<DB>>, pool: sqlx::Pool<DB>) {
    loop {
        tokio::time::sleep(SWEEP_EVERY).await;
        let Some(kept) = kept.upgrade() else {
            return;
        };
        let (stale, done) = {
            let mut st = kept.lock();
            let stale = if pool.is_closed() {
                std::mem::take(&mut st.idle)
            } else {
                split_stale(&mut st.idle, kept.keep_idle)
            };
            let done = st.idle.is_empty();
            if done {
                st.sweeping = false;
            }
            (stale, done)
        };
        drop(stale);
        if done {
            return;
        }
    }
}
