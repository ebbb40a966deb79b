use clap::Parser as _;
use interceptor::{
    cli::{Cli, Command},
    commands, logging,
};

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if let Err(e) = logging::init(cli.log_format, &cli.log_level) {
        eprintln!("error: {e:#}");
        return std::process::ExitCode::from(2);
    }
    let result = match cli.command {
        Command::Run(args) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(commands::run::run(args))),
        Command::Status(args) => commands::status::status(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
