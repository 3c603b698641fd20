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

/// How a server writes its log (`--log-format`): lines for a person, or one JSON object per
/// line for a collector, with the call's span and its `trace_id` in `span` (docs/reliability.md
/// §9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}
