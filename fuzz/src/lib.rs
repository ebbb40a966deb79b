//! What the fuzz targets check of every pod configuration an input was turned into.
use interceptor_config::InterceptionConfig;

/// An accepted configuration reads back the same through both of its forms: its JSON (the
/// API's and the records') and proxy-init's flags (`interceptor run`'s, older records'). `what`
/// names where it came from, for the failure's message.
pub fn assert_round_trips(config: &InterceptionConfig, what: &str) {
    let json = serde_json::to_string(config).expect("a configuration serializes");
    let back: InterceptionConfig =
        serde_json::from_str(&json).unwrap_or_else(|e| panic!("{json} of {what}: {e}"));
    assert_eq!(&back, config, "the JSON form gives {what} back");
    let flags = config.to_args();
    let again = InterceptionConfig::from_proxy_init_args(&flags)
        .unwrap_or_else(|e| panic!("{flags:?} of {what}: {e}"));
    assert_eq!(&again, config, "the flags give {what} back");
}
