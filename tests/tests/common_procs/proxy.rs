//! A TCP proxy that can cut a service away from a worker and bring it back.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use super::*;

/// A TCP proxy on a loopback port in front of `upstream`, in this process: [`Proxy::cut`] closes the port and
/// every connection through it (what a client sees of a stopped server), [`Proxy::restore`] opens the same
/// port again.
pub struct Proxy {
    addr: SocketAddr,
    upstream: String,
    task: Option<JoinHandle<()>>,
}

impl Proxy {
    pub async fn start(upstream: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let addr = listener.local_addr().expect("the proxy's address");
        let mut p = Self {
            addr,
            upstream: upstream.to_owned(),
            task: None,
        };
        p.serve(listener);
        p
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn serve(&mut self, listener: TcpListener) {
        let upstream = self.upstream.clone();
        self.task = Some(tokio::spawn(async move {
            // Dropping the set (when this task is aborted) aborts every connection: their sockets close.
            let mut connections = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((mut client, _)) = accepted else { continue };
                        let upstream = upstream.clone();
                        connections.spawn(async move {
                            if let Ok(mut server) = TcpStream::connect(&upstream).await {
                                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                            }
                        });
                    }
                    Some(_) = connections.join_next(), if !connections.is_empty() => {}
                }
            }
        }));
    }

    /// Closes the port and every open connection.
    pub async fn cut(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
            let _ = t.await;
        }
    }

    /// Opens the same port again.
    pub async fn restore(&mut self) {
        assert!(self.task.is_none(), "the proxy is not cut");
        let deadline = Deadline::after(Duration::from_secs(30));
        let listener = loop {
            match TcpListener::bind(self.addr).await {
                Ok(l) => break l,
                Err(e) if !deadline.passed() => {
                    println!("proxy: rebinding {}: {e}; again", self.addr);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("cannot listen on {} again: {e}", self.addr),
            }
        };
        self.serve(listener);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}
