//! The faces' wire formats, pure: how the model's values are spelled in bytes on each protocol,
//! and how those bytes are read back, with no I/O. The HTTP layer carries these bytes; what they
//! say is decided here, so each format is testable on its own.

pub mod ds_body;
pub mod ds_sse_event;
pub mod gather;
pub mod s2_json;
pub mod s2_proto;
pub mod s2_resources;
pub mod s2_sse_event;
pub mod s2s_frame;
pub mod streamld_target;
