//! Runnel: a durable stream server. One storage engine, one stream model, several wire faces.
//!
//! Layers, outermost first: `http` (faces that translate requests), `service` (the stream
//! service that owns the rules with state), `model` (pure domain types and rules), `storage`
//! (the durable log).

pub mod config;
pub mod http;
pub mod model;
pub mod replication;
pub mod server;
pub mod service;
pub mod storage;
pub mod tools;
