//! A no-op HTTP/1.1 server: reads each request body and answers 204. It is the ceiling the
//! client can reach on this machine, measured in the same run as the real servers.

use anyhow::Result;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::io::Write;
use tokio::net::TcpListener;

async fn handle(req: Request<Incoming>) -> Result<Response<Empty<Bytes>>, Infallible> {
    // Drain the body so the connection stays reusable, as a real server would.
    let _ = req.into_body().collect().await;
    let mut resp = Response::new(Empty::new());
    *resp.status_mut() = StatusCode::NO_CONTENT;
    Ok(resp)
}

pub async fn serve(listen: &str) -> Result<()> {
    let listener = TcpListener::bind(listen).await?;
    println!("noop listening on {}", listener.local_addr()?);
    std::io::stdout().flush()?;
    loop {
        let (tcp, _) = listener.accept().await?;
        let _ = tcp.set_nodelay(true);
        tokio::spawn(async move {
            let _ = http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(tcp), service_fn(handle))
                .await;
        });
    }
}
