//! A Prometheus server scraping a worker.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;

/// A throwaway Prometheus server (the `prometheus` binary on `PATH`, which `scripts/prometheus.sh install`
/// provides) scraping one target every second with `ops/alerts.yml` loaded, its config and TSDB in `dir`.
/// Killed when dropped.
pub struct Prometheus {
    pub url: String,
    proc: Proc,
}

/// The `prometheus` executable on `PATH`, found the way `scripts/prometheus.sh` finds it (`command -v`).
pub fn prometheus_binary() -> PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join("prometheus"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "prometheus is not on PATH: install it with `bash scripts/prometheus.sh install` \
                 (scripts/test.sh does, through `scripts/prometheus.sh rules`, before the tests)"
            )
        })
}

impl Prometheus {
    pub async fn start(dir: &Path, target: SocketAddr) -> Self {
        let bin = prometheus_binary();
        let dir = dir.join("prometheus");
        std::fs::create_dir_all(&dir).expect("the Prometheus directory");
        std::fs::copy(root().join("ops/alerts.yml"), dir.join("alerts.yml"))
            .expect("copy ops/alerts.yml");
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - alerts.yml\n\
                 scrape_configs:\n  - job_name: txinbox\n    scrape_interval: 1s\n    scrape_timeout: 1s\n    \
                 static_configs:\n      - targets: [\"{target}\"]\n"
            ),
        )
        .expect("write the Prometheus config");
        let listen = free_addr();
        let args = [
            format!("--config.file={}", config.display()),
            format!("--storage.tsdb.path={}", dir.join("data").display()),
            format!("--web.listen-address={listen}"),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut proc = Proc::spawn_path(&dir, "prometheus", &bin, &args, &[]);
        let url = format!("http://{listen}");
        let client = http();
        let deadline = Deadline::after(Duration::from_secs(60));
        loop {
            if let Some((200, _)) = get(&client, &format!("{url}/-/ready")).await {
                break;
            }
            proc.assert_running();
            assert!(
                !deadline.passed(),
                "prometheus did not become ready on {listen}:\n{}",
                proc.tail()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        println!("prometheus at {url} scraping {target}");
        Self { url, proc }
    }

    /// `GET /api/v1/query`: the result vector, or what went wrong.
    pub async fn query(
        &self,
        client: &reqwest::Client,
        expr: &str,
    ) -> Result<Vec<serde_json::Value>, String> {
        let r = client
            .get(format!("{}/api/v1/query", self.url))
            .query(&[("query", expr)])
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let body: serde_json::Value =
            serde_json::from_str(&r.text().await.map_err(|e| e.to_string())?)
                .map_err(|e| e.to_string())?;
        if body["status"] != "success" {
            return Err(format!("query failed: {body}"));
        }
        Ok(body["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }

    /// `GET /api/v1/targets`, as text.
    pub async fn targets(&self, client: &reqwest::Client) -> String {
        get(client, &format!("{}/api/v1/targets", self.url))
            .await
            .map(|(_, b)| b)
            .unwrap_or_default()
    }

    pub async fn stop(mut self) {
        self.proc.sigterm().await;
    }
}
