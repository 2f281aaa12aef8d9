//! `lmx serve` end to end: the real binary on a free port, spoken to over HTTP by a real client
//! (ureq), on the tiny llama fixture (its tokenizer and chat template) and on a preset with
//! fresh weights where a sequence must run long.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, Stdio};

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/llama")
}

/// A running `lmx serve`, killed when dropped.
struct Server {
    child: Child,
    url: String,
    _stdout: BufReader<ChildStdout>,
}

impl Server {
    /// Starts `lmx serve ARGS --port 0` and waits for the address it prints.
    fn start(args: &[&str], env: &[(&str, &str)]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_lmx"))
            .arg("serve")
            .args(args)
            .args(["--port", "0"])
            .env_remove("LMX_API_KEY")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("lmx serve starts");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("lmx serve printed {line:?}, not its address"))
            .to_owned();
        Server {
            child,
            url,
            _stdout: stdout,
        }
    }

    /// Serves the llama fixture.
    fn fixture(extra: &[&str]) -> Server {
        let model = fixture();
        let mut args = vec!["--model", model.to_str().unwrap(), "--name", "tiny"];
        args.extend_from_slice(extra);
        Server::start(&args, &[])
    }

    /// Serves fresh weights of a preset whose context lets a sequence run a few hundred tokens.
    fn long(extra: &[&str]) -> Server {
        let mut args = vec!["--model", "gpt2", "--preset", "bytes", "--name", "bytes"];
        args.extend_from_slice(extra);
        Server::start(&args, &[])
    }

    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        answer(ureq::post(&format!("{}{path}", self.url)).send_json(body))
    }

    fn get(&self, path: &str) -> (u16, Value) {
        answer(ureq::get(&format!("{}{path}", self.url)).call())
    }

    /// Posts a streaming request; the events' JSON payloads until `[DONE]` (which must come).
    fn stream(&self, path: &str, body: &Value) -> Vec<Value> {
        let response = ureq::post(&format!("{}{path}", self.url))
            .send_json(body)
            .expect("the stream starts");
        assert_eq!(response.header("content-type"), Some("text/event-stream"));
        let mut events = Vec::new();
        for line in BufReader::new(response.into_reader()).lines() {
            let line = line.unwrap();
            let Some(data) = line.strip_prefix("data: ") else {
                continue;
            };
            if data == "[DONE]" {
                return events;
            }
            events.push(serde_json::from_str(data).unwrap());
        }
        panic!("the stream ended without [DONE] after {events:?}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An answer's status and JSON body, whatever the status.
fn answer(result: Result<ureq::Response, ureq::Error>) -> (u16, Value) {
    let response = match result {
        Ok(response) => response,
        Err(ureq::Error::Status(_, response)) => response,
        Err(err) => panic!("no answer: {err}"),
    };
    let status = response.status();
    let mut text = String::new();
    response.into_reader().read_to_string(&mut text).unwrap();
    let body = serde_json::from_str(&text)
        .unwrap_or_else(|err| panic!("status {status}: {text:?} is not JSON: {err}"));
    (status, body)
}

fn completion(prompt: &str, max_tokens: u64) -> Value {
    json!({ "model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0 })
}

/// What `lmx generate` continues `prompt` with, greedily.
fn generated(prompt: &str, max_tokens: u64) -> String {
    generated_with(prompt, max_tokens, &[])
}

/// `lmx generate`'s greedy text with `extra` flags.
fn generated_with(prompt: &str, max_tokens: u64, extra: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_lmx"))
        .args([
            "generate",
            "--model",
            fixture().to_str().unwrap(),
            "--prompt",
            prompt,
        ])
        .args([
            "--max-tokens",
            &max_tokens.to_string(),
            "--temperature",
            "0",
        ])
        .args(extra)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    stdout
        .strip_prefix(prompt)
        .and_then(|text| text.strip_suffix('\n'))
        .unwrap_or_else(|| panic!("lmx generate printed {stdout:?}"))
        .to_owned()
}

#[test]
fn completions_and_chat_streamed_or_not_give_lmx_generate_s_greedy_text() {
    let server = Server::fixture(&[]);
    let (status, models) = server.get("/v1/models");
    assert_eq!(status, 200);
    assert_eq!(models["data"][0]["id"], "tiny");

    let prompt = "First Citizen: Before we proceed";
    let (status, whole) = server.post("/v1/completions", &completion(prompt, 20));
    assert_eq!(status, 200, "{whole}");
    let text = whole["choices"][0]["text"].as_str().unwrap().to_owned();
    assert_eq!(text, generated(prompt, 20));
    let usage = &whole["usage"];
    assert_eq!(
        usage["total_tokens"],
        usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap()
    );

    // OpenAI's frequency penalty counts every token so far: `lmx generate`'s over a context as
    // long as the model's (the fixture's 64).
    let penalised = json!({
        "model": "tiny", "prompt": prompt, "max_tokens": 20, "temperature": 0,
        "frequency_penalty": 1.5
    });
    let (status, answer) = server.post("/v1/completions", &penalised);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["choices"][0]["text"].as_str().unwrap(),
        generated_with(
            prompt,
            20,
            &["--frequency-penalty", "1.5", "--penalty-context", "64"]
        )
    );

    // Sampling is reproducible from a seed.
    let seeded = json!({ "model": "tiny", "prompt": prompt, "max_tokens": 20, "seed": 7 });
    let (first, again) = (
        server.post("/v1/completions", &seeded).1,
        server.post("/v1/completions", &seeded).1,
    );
    assert_eq!(first["choices"][0]["text"], again["choices"][0]["text"]);

    let mut streamed = completion(prompt, 20);
    streamed["stream"] = json!(true);
    let events = server.stream("/v1/completions", &streamed);
    let joined: String = events
        .iter()
        .map(|e| e["choices"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(joined, text);
    assert_eq!(
        events.last().unwrap()["choices"][0]["finish_reason"],
        whole["choices"][0]["finish_reason"]
    );

    // The chat template renders the conversation; its greedy answer is the completion of the
    // rendered text.
    let messages = json!([{ "role": "user", "content": "Speak, speak." }]);
    let chat = json!({ "model": "tiny", "messages": messages, "max_tokens": 16, "temperature": 0 });
    let (status, answer) = server.post("/v1/chat/completions", &chat);
    assert_eq!(status, 200, "{answer}");
    let message = &answer["choices"][0]["message"];
    assert_eq!(message["role"], "assistant");
    let content = message["content"].as_str().unwrap();
    let (_, rendered) = server.post(
        "/v1/completions",
        &completion("<|user|>Speak, speak.</s><|assistant|>", 16),
    );
    assert_eq!(content, rendered["choices"][0]["text"]);

    let mut chat_stream = chat.clone();
    chat_stream["stream"] = json!(true);
    chat_stream["stream_options"] = json!({ "include_usage": true });
    let events = server.stream("/v1/chat/completions", &chat_stream);
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    let joined: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(joined, content);
    assert_eq!(events.last().unwrap()["usage"], answer["usage"]);

    // A stop string ends the text before it.
    let cut: String = content.chars().skip(3).take(2).collect();
    if !cut.is_empty() {
        let mut stopped = chat.clone();
        stopped["stop"] = json!([cut]);
        let (_, answer) = server.post("/v1/chat/completions", &stopped);
        let expected = &content[..content.find(&cut).unwrap()];
        assert_eq!(answer["choices"][0]["message"]["content"], expected);
        assert_eq!(answer["choices"][0]["finish_reason"], "stop");
    }
}

#[test]
fn thirty_two_concurrent_clients_each_get_their_own_sequence_s_text() {
    let server = Server::fixture(&["--max-batch", "8"]);
    let prompts = ["All: Speak", "First Citizen", "Before we", "hear me speak."];
    let alone: Vec<Value> = prompts
        .iter()
        .map(|prompt| server.post("/v1/completions", &completion(prompt, 12)).1)
        .collect();
    let answers: Vec<(usize, u16, Value)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..32)
            .map(|client| {
                let server = &server;
                scope.spawn(move || {
                    let which = client % prompts.len();
                    let mut body = completion(prompts[which], 12);
                    if client % 2 == 1 {
                        body["stream"] = json!(true);
                        let events = server.stream("/v1/completions", &body);
                        let text: String = events
                            .iter()
                            .map(|e| e["choices"][0]["text"].as_str().unwrap())
                            .collect();
                        return (which, 200, json!({ "choices": [{ "text": text }] }));
                    }
                    let (status, answer) = server.post("/v1/completions", &body);
                    (which, status, answer)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| handle.join().unwrap())
            .collect()
    });
    for (which, status, answer) in answers {
        assert_eq!(status, 200, "{answer}");
        assert_eq!(
            answer["choices"][0]["text"],
            alone[which]["choices"][0]["text"]
        );
    }
}

#[test]
fn bad_requests_get_openai_errors_and_the_server_keeps_serving() {
    let server = Server::fixture(&["--max-body-bytes", "2048", "--max-tokens", "100"]);
    let raw = |body: &str| {
        answer(
            ureq::post(&format!("{}/v1/completions", server.url))
                .set("content-type", "application/json")
                .send_string(body),
        )
    };
    let (status, error) = raw("{\"model\": \"tiny\", \"prompt\": ");
    assert_eq!(status, 400);
    assert_eq!(error["error"]["type"], "invalid_request_error");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("line 1 column"),
        "{error}"
    );

    let (status, error) = raw(r#"{"model": "tiny", "prompt": "a", "temperature": "hot"}"#);
    assert_eq!(status, 400);
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("temperature"),
        "{error}"
    );

    let (status, error) = raw(&format!(
        r#"{{"model": "tiny", "prompt": "{}"}}"#,
        "a".repeat(4096)
    ));
    assert_eq!(
        (status, error["error"]["code"].as_str()),
        (413, Some("request_too_large"))
    );

    let cases = [
        (json!({ "model": "other", "prompt": "a" }), 404, "model"),
        (
            json!({ "model": "tiny", "prompt": "a", "max_tokens": 101 }),
            400,
            "max_tokens",
        ),
        (
            json!({ "model": "tiny", "prompt": "a", "max_tokens": 0 }),
            400,
            "max_tokens",
        ),
        (json!({ "model": "tiny", "prompt": "a", "n": 2 }), 400, "n"),
        (
            json!({ "model": "tiny", "prompt": "a", "temperature": 3 }),
            400,
            "temperature",
        ),
        (
            json!({ "model": "tiny", "prompt": "a", "top_p": 0 }),
            400,
            "top_p",
        ),
        (
            json!({ "model": "tiny", "prompt": "a", "presence_penalty": -3 }),
            400,
            "presence_penalty",
        ),
        (
            json!({ "model": "tiny", "prompt": "a", "logit_bias": { "999": 1 } }),
            400,
            "logit_bias",
        ),
        (
            json!({ "model": "tiny", "prompt": "a", "stop": ["", "b"] }),
            400,
            "stop",
        ),
        (
            json!({ "model": "tiny", "prompt": ["a", "b"] }),
            400,
            "prompt",
        ),
        (
            json!({ "model": "tiny", "prompt": [5, 9999] }),
            400,
            "prompt",
        ),
        (json!({ "model": "tiny", "prompt": "" }), 400, "prompt"),
        (
            json!({ "model": "tiny", "prompt": "a ".repeat(200) }),
            400,
            "prompt",
        ),
        (json!({ "model": "tiny", "messages": [] }), 400, "prompt"),
    ];
    for (body, status, param) in &cases {
        let path = if body.get("messages").is_some() {
            "/v1/chat/completions"
        } else {
            "/v1/completions"
        };
        let (got, error) = server.post(path, body);
        assert_eq!(got, *status, "{body} -> {error}");
        if *status == 400 && body.get("messages").is_none() {
            assert_eq!(error["error"]["param"], *param, "{body} -> {error}");
        }
    }
    let (status, error) = server.post(
        "/v1/chat/completions",
        &json!({ "model": "tiny", "messages": [{ "role": "user", "content": [{ "type": "image_url" }] }] }),
    );
    assert_eq!(status, 400, "{error}");
    let (status, error) = server.post("/v1/completions", &completion(&"a ".repeat(200), 5));
    assert_eq!(
        (status, error["error"]["code"].as_str()),
        (400, Some("context_length_exceeded"))
    );
    let (status, _) = server.get("/v1/nothing");
    assert_eq!(status, 404);
    let (status, _) = server.get("/v1/completions");
    assert_eq!(status, 405);

    let (status, answer) = server.post("/v1/completions", &completion("All: Speak", 4));
    assert_eq!(status, 200, "{answer}");
}

#[test]
fn an_api_key_is_required_as_a_bearer_token() {
    let model = fixture();
    let server = Server::start(
        &["--model", model.to_str().unwrap(), "--name", "tiny"],
        &[("LMX_API_KEY", "sesame")],
    );
    let url = format!("{}/v1/models", server.url);
    let (status, error) = answer(ureq::get(&url).call());
    assert_eq!(
        (status, error["error"]["code"].as_str()),
        (401, Some("missing_api_key"))
    );
    let (status, error) = answer(ureq::get(&url).set("Authorization", "Bearer sesamE").call());
    assert_eq!(
        (status, error["error"]["code"].as_str()),
        (401, Some("invalid_api_key"))
    );
    let (status, _) = answer(ureq::get(&url).set("Authorization", "Bearer sesame").call());
    assert_eq!(status, 200);
}

/// A long greedy stream that cannot end early: the end-of-sequence id is biased away.
fn long_stream() -> Value {
    json!({
        "model": "bytes", "prompt": "abc", "max_tokens": 250, "temperature": 0, "stream": true,
        "logit_bias": { "256": -100 },
    })
}

#[test]
fn a_client_that_leaves_mid_stream_has_its_sequence_cancelled() {
    let server = Server::long(&["--max-batch", "1"]);
    let response = ureq::post(&format!("{}/v1/completions", server.url))
        .send_json(long_stream())
        .unwrap();
    let mut reader = BufReader::new(response.into_reader());
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert!(line.starts_with("data: "), "{line}");
    drop(reader);
    // The sequence, which would run 250 tokens, is cancelled (and its place freed).
    let mut health = server.get("/health").1;
    for _ in 0..600 {
        if health["cancelled"] == 1 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        health = server.get("/health").1;
    }
    assert_eq!(health["cancelled"], 1, "{health}");
    assert_eq!(health["finished"], 0, "{health}");
    // The place is free for the next request, whose logit bias forces its tokens.
    let (status, answer) = server.post(
        "/v1/completions",
        &json!({ "model": "bytes", "prompt": "abc", "max_tokens": 3, "logit_bias": { "65": 100 } }),
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["choices"][0]["text"], "AAA");
}

#[test]
fn sigterm_finishes_the_requests_in_flight_then_exits_0() {
    let mut server = Server::long(&[]);
    let response = ureq::post(&format!("{}/v1/completions", server.url))
        .send_json(long_stream())
        .unwrap();
    let mut lines = BufReader::new(response.into_reader()).lines();
    assert!(lines.next().unwrap().unwrap().starts_with("data: "));
    // SAFETY: kill only sends a signal to the child.
    assert_eq!(
        unsafe { libc::kill(server.child.id() as i32, libc::SIGTERM) },
        0
    );
    let mut text = String::new();
    let mut finish = Value::Null;
    let mut done = false;
    for line in lines {
        let line = line.unwrap();
        match line.strip_prefix("data: ") {
            Some("[DONE]") => done = true,
            Some(data) => {
                let event: Value = serde_json::from_str(data).unwrap();
                text.push_str(event["choices"][0]["text"].as_str().unwrap());
                finish = event["choices"][0]["finish_reason"].clone();
            }
            None => {}
        }
    }
    assert!(done, "the stream ended without [DONE]");
    assert_eq!(finish, "length");
    let status = server.child.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(ureq::get(&format!("{}/health", server.url)).call().is_err());
}

#[test]
fn with_no_grace_sigterm_cancels_the_streams_in_flight_and_exits_0() {
    let mut server = Server::long(&["--shutdown-grace", "0"]);
    let response = ureq::post(&format!("{}/v1/completions", server.url))
        .send_json(long_stream())
        .unwrap();
    let mut lines = BufReader::new(response.into_reader()).lines();
    assert!(lines.next().unwrap().unwrap().starts_with("data: "));
    // SAFETY: kill only sends a signal to the child.
    assert_eq!(
        unsafe { libc::kill(server.child.id() as i32, libc::SIGTERM) },
        0
    );
    let status = server.child.wait().unwrap();
    assert!(status.success(), "{status}");
    // The stream was cut before its 250 tokens: it never says [DONE].
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(!rest.iter().any(|line| line == "data: [DONE]"), "{rest:?}");
}

#[test]
fn a_full_queue_answers_429_and_frees_up_as_sequences_end() {
    let server = Server::long(&["--max-batch", "1", "--max-queue", "1"]);
    let start = || {
        let response = ureq::post(&format!("{}/v1/completions", server.url))
            .send_json(long_stream())
            .unwrap();
        BufReader::new(response.into_reader())
    };
    // The first stream holds the batch's one place (its first token came); the second's
    // answer started, so it is queued, and the queue is full.
    let mut running = start();
    let mut line = String::new();
    running.read_line(&mut line).unwrap();
    let queued = start();
    let (status, error) = server.post(
        "/v1/completions",
        &json!({ "model": "bytes", "prompt": "abc", "max_tokens": 3 }),
    );
    assert_eq!(
        (status, error["error"]["code"].as_str()),
        (429, Some("queue_full")),
        "{error}"
    );
    assert_eq!(error["error"]["type"], "rate_limit_error");
    // The first client leaves: the queued stream runs to its end.
    drop(running);
    let lines: Vec<String> = queued.lines().map(Result::unwrap).collect();
    assert_eq!(
        lines.iter().filter(|line| *line == "data: [DONE]").count(),
        1
    );
}

#[test]
fn a_model_that_cannot_be_loaded_is_an_error_before_listening() {
    let output = Command::new(env!("CARGO_BIN_EXE_lmx"))
        .args([
            "serve", "--model", "gpt2", "--preset", "nope", "--port", "0",
        ])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(
        output.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("gpt2 has no preset `nope`"), "{stderr}");
}

#[test]
fn a_run_s_checkpoint_is_served_as_lmx_generate_samples_it() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let run = run.to_str().unwrap();
    let lmx = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_lmx"))
            .args(args)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    };
    lmx(&[
        "train",
        "--preset",
        "tiny-bytes",
        "--batch-size",
        "4",
        "--seq-len",
        "32",
        "--steps",
        "3",
        "--quiet",
        "--sample",
        "0",
        "--out",
        run,
    ]);
    let printed = lmx(&[
        "generate",
        "--run",
        run,
        "--prompt",
        "ROMEO:",
        "--max-tokens",
        "12",
        "--temperature",
        "0",
    ]);
    let server = Server::start(&["--run", run, "--name", "run"], &[]);
    let (status, answer) = server.post(
        "/v1/completions",
        &json!({ "model": "run", "prompt": "ROMEO:", "max_tokens": 12, "temperature": 0 }),
    );
    assert_eq!(status, 200, "{answer}");
    let text = answer["choices"][0]["text"].as_str().unwrap();
    assert_eq!(format!("ROMEO:{text}\n"), printed);
    // A run's byte tokenizer has no chat template.
    let (status, error) = server.post(
        "/v1/chat/completions",
        &json!({ "model": "run", "messages": [{ "role": "user", "content": "hi" }] }),
    );
    assert_eq!(status, 400, "{error}");
    assert!(error["error"]["message"]
        .as_str()
        .unwrap()
        .contains("no chat template"));
}
