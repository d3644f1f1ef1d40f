//! The follow primitive on its own: the events a follower hears for each thing that can happen
//! to its stream.
