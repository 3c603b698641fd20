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

impl LogFormat {
    /// Installs the process's log on `writer`: the filter from the environment variable
    /// `filter_var` (default `info`); text in colour only for a person at a terminal (never in a
    /// redirected log, never with NO_COLOR), or JSON with the current span's fields.
    pub fn install<W>(self, filter_var: &str, writer: W)
    where
        W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
    {
        let builder = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_env(filter_var)
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
            )
            .with_writer(writer);
        match self {
            LogFormat::Text => builder
                .with_ansi(
                    std::io::IsTerminal::is_terminal(&std::io::stderr())
                        && std::env::var_os("NO_COLOR").is_none(),
                )
                .init(),
            LogFormat::Json => builder
                .json()
                .with_current_span(true)
                .with_span_list(false)
                .init(),
        }
    }
}
