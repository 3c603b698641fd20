//! The command line of every binary here parsed one way: help and `--version` print and exit 0,
//! bad usage prints clap's message and exits [`racp_proto::EXIT_USAGE`] (64, EX_USAGE).

use std::process::ExitCode;

/// The parsed command line, or the exit code to end with after clap printed why.
pub fn parse<C: clap::Parser>() -> Result<C, ExitCode> {
    C::try_parse().map_err(|error| {
        let _ = error.print();
        ExitCode::from(if error.use_stderr() {
            racp_proto::EXIT_USAGE
        } else {
            0
        })
    })
}
