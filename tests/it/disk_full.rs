//! A full disk: appends are refused with 507 and `Retry-After` before anything is sequenced,
//! nothing acknowledged is lost, reads go on, and writes resume by themselves once space returns.
//! Runs on a small tmpfs, which needs root to mount; elsewhere the test says so and skips.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use reqwest::Method;

use crate::common::{Client, Server, header};

const RESERVE: u64 = 32 << 20;

/// A tmpfs of `size_mib`, unmounted on drop.
struct SmallDisk {
    mount: PathBuf,
    _dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(size_mib: u64) -> Option<SmallDisk> {
        let dir = tempfile::tempdir().unwrap();
        let mount = dir.path().join("disk");
        std::fs::create_dir(&mount).unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mib}m"), "tmpfs"])
            .arg(&mount)
            .status()
            .is_ok_and(|s| s.success());
        mounted.then_some(SmallDisk { mount, _dir: dir })
    }

    fn free(&self) -> u64 {
        let stats = rustix::fs::statvfs(&self.mount).unwrap();
        stats.f_bavail * stats.f_frsize
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mount).status();
    }
}

async fn append(server: &Server, body: &str) -> reqwest::Response {
    Client::new(server)
        .append("/v1/stream/log", "text/plain", body.to_string())
        .await
}

async fn contents(server: &Server) -> String {
    let response = Client::new(server).read("/v1/stream/log", "-1").await;
    assert_eq!(response.status(), 200);
    response.text().await.unwrap()
}

fn start(data: &Path) -> Server {
    Server::start(&[
        "--data-dir",
        data.to_str().unwrap(),
        "--min-free-bytes",
        &RESERVE.to_string(),
    ])
}

#[tokio::test]
async fn a_full_disk_refuses_appends_loses_nothing_and_recovers_when_space_returns() {
    let Some(disk) = SmallDisk::mount(128) else {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    };
    let data = disk.mount.join("data");
    let server = start(&data);
    let http = Client::new(&server);
    let created = http.create("/v1/stream/log", "text/plain", "").await;
    assert_eq!(created.status(), 201);
    assert_eq!(http.create_bucket("bkt1").await.status(), 201);
    let bucketed = http.create("/bkt1/s", "text/plain", "x").await;
    assert_eq!(bucketed.status(), 201);
    let snapshot_at = header(&bucketed, "stream-next-offset").unwrap().to_string();
    let mut acked = String::new();
    for i in 0..20 {
        let body = format!("before-{i};");
        assert_eq!(append(&server, &body).await.status(), 204);
        acked.push_str(&body);
    }

    // Fill the disk until less than the reserve is free.
    let filler = disk.mount.join("filler");
    let fill = disk.free().saturating_sub(RESERVE / 2);
    std::fs::write(&filler, vec![0u8; usize::try_from(fill).unwrap()]).unwrap();
    assert!(disk.free() < RESERVE);

    let deadline = Instant::now() + Duration::from_secs(10);
    let refused = loop {
        let body = format!("while-filling-{};", acked.len());
        let response = append(&server, &body).await;
        match response.status().as_u16() {
            204 => acked.push_str(&body),
            507 => break response,
            other => panic!("unexpected status {other}"),
        }
        assert!(Instant::now() < deadline, "appends were never refused");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(header(&refused, "retry-after").is_some());
    assert!(refused.text().await.unwrap().contains("disk is full"));
    // Every other write is refused too: a bucket, attributes, a snapshot (up to the body limit).
    let others = [
        http.request(Method::PUT, "/bkt2"),
        http.request(Method::PUT, "/bkt1/s/attrs")
            .header("content-type", "application/json")
            .body(r#"{"k":"v"}"#),
        http.request(Method::PUT, &format!("/bkt1/s/snapshot/{snapshot_at}"))
            .header("content-type", "application/octet-stream")
            .body(vec![7u8; 1 << 20]),
    ];
    for request in others {
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 507, "{}", response.url());
    }
    assert_eq!(
        contents(&server).await,
        acked,
        "reads go on, with every acked append"
    );

    // Space returns: appends go through again without a restart.
    std::fs::remove_file(&filler).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let body = "after;";
        let response = append(&server, body).await;
        if response.status() == 204 {
            acked.push_str(body);
            break;
        }
        assert_eq!(response.status(), 507);
        assert!(Instant::now() < deadline, "writes never resumed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(contents(&server).await, acked);

    server.kill();
    let server = start(&data);
    assert_eq!(
        contents(&server).await,
        acked,
        "everything acknowledged survives a crash, nothing refused appears"
    );
}
