//! The tests of what only PostgreSQL has: transactions committing out of
//! order, lock order across processes, a server restart, many processes on
//! one server, followers into a PostgreSQL hub.

mod feed;
mod follow;
mod locks;
mod lone;
mod processes;
mod reader;
mod restart;
