//! proxy-init's argv into an `InterceptionConfig`, as `interceptor run`, the agent's API
//! (`args`) and records of older agents read it. Input: one argument per line.
//!
//! What parses is valid: its flags and its JSON form give it back, and the JSON form is read
//! back as the same configuration; what is refused says why.
#![no_main]

use interceptor_config::InterceptionConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let args: Vec<String> = text.split('\n').map(str::to_owned).collect();
    match InterceptionConfig::from_proxy_init_args(&args) {
        Ok(config) => {
            let flags = config.to_args();
            let again = InterceptionConfig::from_proxy_init_args(&flags)
                .unwrap_or_else(|e| panic!("{flags:?} of a parsed configuration: {e}"));
            assert_eq!(again, config, "the flags give the configuration back");
            let json = serde_json::to_string(&config).expect("a configuration serializes");
            let back: InterceptionConfig = serde_json::from_str(&json)
                .unwrap_or_else(|e| panic!("{json} of a parsed configuration: {e}"));
            assert_eq!(back, config, "the JSON form gives the configuration back");
        }
        Err(e) => assert!(!e.to_string().is_empty(), "a refusal says why"),
    }
});
