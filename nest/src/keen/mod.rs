//! The Keen text tool dialect: the `<SYSTEM CALL>` parser, the canonical tools prompt,
//! `keen-tools.json`, sandboxed script tools (QuickJS) and flow tools.
