//! The integration tests: one binary, one module per topic, each test against real `runnel serve`
//! processes (`common::Server`) on loopback ports the OS picks, with data in temporary
//! directories, so the tests share nothing and run in parallel threads. They talk to a server
//! through `common::Client`, which names the requests they make again and again.

mod common;

mod auth;
mod bad_input;
mod catch_up;
mod cli;
mod connections;
mod corruption;
mod data_tools;
mod disk_full;
mod durability;
mod limits;
mod live_reads;
mod live_table;
mod mirror_tls;
mod observability;
mod pipelining;
mod replication;
mod s2s;
mod token_recipes;
mod trim;
