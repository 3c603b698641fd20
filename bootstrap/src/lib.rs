//! The SSH bootstrapper (issue 6).
