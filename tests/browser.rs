//! The review page in a real browser: headless Chromium driven over WebDriver by chromedriver,
//! against `countersign serve` as a real process over a fresh state directory. A reviewer signs
//! in, reads an approval and decides it with clicks and keystrokes; what happened is checked
//! through the API, the ledger and the audit log, not only on the page.
//!
//! Needs Debian's `chromium` and `chromium-driver` (`scripts/test-all` installs them).
//! `CHROMEDRIVER` and `CHROMIUM` name other binaries. Without them every test here fails.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::actions::{InputSource, MOUSE_BUTTON_LEFT, MouseActions, PointerAction};
use fantoccini::elements::Element;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

mod common;

use common::server::{Paused, Server};
use common::{countersign, free_port, fresh_path, stop_group};
use shared::domain::identity::Directory;
/// How long the page may take to show what a test waits for.
const PATIENCE: Duration = Duration::from_secs(20);
/// A phone's screen in CSS pixels, width and height: an iPhone 14's, a common small one.
const PHONE: (u32, u32) = (390, 844);
/// The smallest target a finger taps reliably, in CSS pixels (Apple's and WCAG's 44).
const TAP_TARGET: f64 = 44.0;

const INSTALL: &str = "the browser tests need Debian's chromium and chromium-driver: \
     apt-get install -y --no-install-recommends chromium chromium-driver \
     (scripts/test-all does this), or set CHROMEDRIVER and CHROMIUM to their paths";

fn binary(variable: &str, default: &str) -> PathBuf {
    let path = std::env::var_os(variable)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(default));
    assert!(
        path.is_file(),
        "{} not found at {}: {INSTALL}",
        variable.to_lowercase(),
        path.display()
    );
    path
}

/// One chromedriver on a free port, in a process group of its own so that the browsers it starts
/// end with it even when a test fails before closing its sessions.
struct Driver {
    child: Child,
    url: String,
    chromium: PathBuf,
    profiles: Vec<PathBuf>,
}

impl Driver {
    async fn start() -> Self {
        let chromedriver = binary("CHROMEDRIVER", "/usr/bin/chromedriver");
        let chromium = binary("CHROMIUM", "/usr/bin/chromium");
        let port = free_port();
        let mut command = Command::new(&chromedriver);
        command
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let child = command.spawn().unwrap_or_else(|e| {
            panic!("{} does not start ({e}): {INSTALL}", chromedriver.display())
        });
        let driver = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
            chromium,
            profiles: Vec::new(),
        };
        let started = Instant::now();
        loop {
            let ready = reqwest::get(format!("{}/status", driver.url))
                .await
                .ok()
                .filter(|r| r.status().is_success());
            if ready.is_some() {
                return driver;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "chromedriver did not answer on {} within 30 s",
                driver.url
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A new browser with `name` signed in to `server`'s page.
    async fn signed_in(&mut self, server: &Server, name: &str) -> Browser {
        let browser = self.browser().await;
        browser.sign_in_as(server, name).await;
        browser
    }

    /// A new browser with an empty profile: a WebDriver session of its own.
    async fn browser(&mut self) -> Browser {
        self.browser_emulating(None).await
    }

    /// A new browser as a phone shows the page: Chrome's device emulation of a screen
    /// [`PHONE`] CSS pixels wide and high, at three device pixels each, with touch.
    async fn phone(&mut self) -> Browser {
        let (width, height) = PHONE;
        let metrics = json!({"width": width, "height": height, "pixelRatio": 3.0, "touch": true});
        self.browser_emulating(Some(json!({ "deviceMetrics": metrics })))
            .await
    }

    /// A new browser, emulating a device when `mobile` gives Chrome's `mobileEmulation`.
    async fn browser_emulating(&mut self, mobile: Option<Value>) -> Browser {
        let profile = fresh_path("countersign-chromium");
        self.profiles.push(profile.clone());
        let mut capabilities = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": self.chromium,
                "args": [
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-quic",
                    "--no-first-run",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                    "--disable-dev-shm-usage",
                    "--window-size=1280,1600",
                    format!("--user-data-dir={}", profile.display()),
                ],
            },
        });
        if let Some(mobile) = mobile {
            capabilities["goog:chromeOptions"]["mobileEmulation"] = mobile;
        }
        let Value::Object(capabilities) = capabilities else {
            unreachable!()
        };
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(capabilities)
            .connect(&self.url)
            .await
            .unwrap_or_else(|e| {
                panic!("chromium does not start under chromedriver ({e}): {INSTALL}")
            });
        Browser { client }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // The whole group: chromedriver and every browser it started.
        stop_group(&mut self.child, "KILL");
        for profile in &self.profiles {
            let _ = std::fs::remove_dir_all(profile);
        }
    }
}

/// One browser window on the review page.
struct Browser {
    client: Client,
}

fn card(approval: &str) -> String {
    format!("[data-approval-id=\"{approval}\"]")
}

impl Browser {
    async fn find(&self, css: &str) -> Element {
        self.client
            .wait()
            .at_most(PATIENCE)
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no {css} on the page ({e})"))
    }

    async fn click(&self, css: &str) {
        self.find(css).await.click().await.unwrap();
    }

    async fn type_into(&self, css: &str, text: &str) {
        let field = self.find(css).await;
        field.clear().await.unwrap();
        field.send_keys(text).await.unwrap();
    }

    /// Runs `script` until it returns something other than null, false or "", and returns it.
    async fn until(&self, what: &str, script: &str) -> Value {
        let started = Instant::now();
        loop {
            let value = self.client.execute(script, vec![]).await.unwrap();
            let done =
                !matches!(&value, Value::Null | Value::Bool(false)) && value.as_str() != Some("");
            if done {
                return value;
            }
            if started.elapsed() > PATIENCE {
                let page = self.text("body").await;
                panic!("waited {PATIENCE:?} for {what}; the page reads:\n{page}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The visible text of the first element `css` selects, or "".
    async fn text(&self, css: &str) -> String {
        let script = format!(
            "const node = document.querySelector({}); return node ? node.innerText : '';",
            json!(css)
        );
        let value = self.client.execute(&script, vec![]).await.unwrap();
        value.as_str().unwrap_or_default().to_string()
    }

    /// Waits until the element `css` selects shows `wanted`, and returns its text.
    async fn text_containing(&self, css: &str, wanted: &str) -> String {
        let script = format!(
            "const node = document.querySelector({}); \
             return node && node.innerText.includes({}) ? node.innerText : null;",
            json!(css),
            json!(wanted)
        );
        let what = format!("{css} to read {wanted:?}");
        self.until(&what, &script)
            .await
            .as_str()
            .unwrap()
            .to_string()
    }

    async fn gone(&self, css: &str) {
        let script = format!("return document.querySelector({}) === null;", json!(css));
        self.until(&format!("{css} to leave the page"), &script)
            .await;
    }

    /// Opens the page as the server's start-up line offers it: with development sign-in, the
    /// link that carries its secret.
    async fn open(&self, server: &Server) {
        let link = match server.offered_dev_secret() {
            Some(secret) => format!("{}/#dev-secret={secret}", server.base),
            None => format!("{}/", server.base),
        };
        self.client.goto(&link).await.unwrap();
    }

    /// Signs in with the development picker, as the local server offers it.
    async fn sign_in_as(&self, server: &Server, name: &str) {
        self.open(server).await;
        let picker = self.find("#dev-sign-in:not([hidden]) #dev-person").await;
        picker.select_by_value(name).await.unwrap();
        self.click("#dev-sign-in button[type=submit]").await;
        self.text_containing("#whoami", &format!("Signed in as {name}"))
            .await;
        self.find("#queue:not([hidden])").await;
    }

    /// Clicks `button` on the card `item`, waits for the card to leave the queue, and returns
    /// the queue's status once it says `saying`.
    async fn decide_card(&self, item: &str, button: &str, saying: &str) -> String {
        self.click(&format!("{item} {button}")).await;
        self.gone(item).await;
        self.text_containing("#queue-status", saying).await
    }

    /// Opens the card `item`'s `form` (edit, comment).
    async fn open_form(&self, item: &str, form: &str) {
        self.click(&format!("{item} details.{form} summary")).await;
    }

    /// Types `text` into the `field` of the card `item`'s open `form` and submits it.
    async fn fill_in(&self, item: &str, form: &str, field: &str, text: &str) {
        self.type_into(&format!("{item} .{form}-form {field}"), text)
            .await;
        self.click(&format!("{item} .{form}-submit")).await;
    }

    async fn sign_out(&self) {
        self.click("#sign-out").await;
        self.find("#sign-in:not([hidden])").await;
    }

    async fn close(self) {
        self.client.close().await.unwrap();
    }
}

/// A development server named `name` with `requester`'s run paused on `claim`, and a browser
/// driver: where most tests start.
async fn under_review(name: &str, requester: &str, claim: &str) -> (Server, Paused, Driver) {
    let server = Server::start_dev(name);
    let paused = server.paused_run(requester, claim, None).await;
    (server, paused, Driver::start().await)
}

/// [`under_review`] with dana signed in: also her browser and the approval's card.
async fn dana_reviews(
    name: &str,
    requester: &str,
    claim: &str,
) -> (Server, Paused, Driver, Browser, String) {
    let (server, paused, mut driver) = under_review(name, requester, claim).await;
    let dana = driver.signed_in(&server, "dana").await;
    let item = card(&paused.approval);
    (server, paused, driver, dana, item)
}

#[tokio::test]
async fn dana_approves_a_claim_in_the_page_and_it_leaves_the_queue() {
    let (server, c102, _driver, dana, item) = dana_reviews("approve", "ben", "c-102").await;
    dana.find(&item).await;
    let shown = dana.text(&item).await;
    let stored = server.approval(&c102.approval).await;
    for expected in [
        stored["explanation"].as_str().unwrap(),
        "reimburse",
        "version 1",
        "$250.00 (25000 cents)",
        "c-102",
        "Reimbursements above $75 need a finance approver.",
        "Anyone with the finance role, except ben, who asked for this",
        "1 of 1 still needed; approved so far: nobody yet",
        stored["args_hash"].as_str().unwrap(),
    ] {
        assert!(
            shown.contains(expected),
            "{expected:?} is not shown:\n{shown}"
        );
    }
    let countdown = format!("{item} .countdown");
    let first = dana.text_containing(&countdown, " left").await;
    assert!(first.contains("h ") && first.contains("m "), "{first}");
    let script = format!(
        "return document.querySelector({}).textContent !== {};",
        json!(countdown),
        json!(first)
    );
    dana.until("the deadline to count down", &script).await;
    // What the page sends with its decision, recorded on its way out.
    let record = "window.sentDecisions = []; const send = window.fetch; \
        window.fetch = (path, init) => { \
          if (String(path).endsWith('/decisions')) window.sentDecisions.push(JSON.parse(init.body)); \
          return send(path, init); }; \
        return true;";
    dana.client.execute(record, vec![]).await.unwrap();

    let status = dana
        .decide_card(&item, "button.approve", "You approved reimburse version 1")
        .await;
    assert!(status.contains("The run is done"), "{status}");
    // The approval as the page showed it goes back with the decision: no read before it.
    let sent = dana
        .client
        .execute("return window.sentDecisions;", vec![])
        .await
        .unwrap();
    assert_eq!(sent.as_array().map(Vec::len), Some(1), "{sent}");
    assert!(stored["snapshot"].is_string(), "{stored}");
    assert_eq!(sent[0]["snapshot"], stored["snapshot"], "{sent}");
    dana.close().await;

    assert_eq!(server.audit(&c102.run).await["run"]["status"], "done");
    assert_eq!(server.approval(&c102.approval).await["status"], "approved");
    assert_eq!(server.payments(), [("c-102".to_string(), 25_000)]);
}

#[tokio::test]
async fn an_approval_too_large_to_send_back_is_still_decided_in_the_page() {
    let (server, c102, _driver, dana, item) = dana_reviews("large", "ben", "c-102").await;
    // Long comments take the approval, and its snapshot, past what a request body may hold.
    let path = format!("/approvals/{}/comments", c102.approval);
    for n in 0..9 {
        let text = format!("{n}: {}", "receipt details ".repeat(120));
        let reply = server.post(&path, "erin", json!({ "text": text })).await;
        assert_eq!(reply.status, 201, "{}", reply.json);
    }
    let stored = server.approval(&c102.approval).await;
    assert!(stored["snapshot"].as_str().unwrap().len() > 16 * 1024);
    dana.client.refresh().await.unwrap();
    dana.find(&item).await;

    dana.decide_card(&item, "button.approve", "You approved reimburse version 1")
        .await;
    dana.close().await;

    assert_eq!(server.approval(&c102.approval).await["status"], "approved");
    assert_eq!(server.payments(), [("c-102".to_string(), 25_000)]);
}

#[tokio::test]
async fn a_double_click_on_approve_decides_once() {
    let (server, c102, _driver, dana, item) = dana_reviews("double-click", "ben", "c-102").await;
    let approve = dana.find(&format!("{item} button.approve")).await;

    let double_click = MouseActions::new("mouse".to_string())
        .then(PointerAction::MoveToElement {
            element: approve,
            duration: None,
            x: 0.0,
            y: 0.0,
        })
        .then(PointerAction::Down {
            button: MOUSE_BUTTON_LEFT,
        })
        .then(PointerAction::Up {
            button: MOUSE_BUTTON_LEFT,
        })
        .then(PointerAction::Down {
            button: MOUSE_BUTTON_LEFT,
        })
        .then(PointerAction::Up {
            button: MOUSE_BUTTON_LEFT,
        });
    dana.client.perform_actions(double_click).await.unwrap();

    dana.gone(&item).await;
    dana.text_containing("#queue-status", "You approved").await;
    assert_eq!(dana.text(".notice").await, "", "no conflict was shown");
    dana.close().await;

    assert_eq!(server.decisions(&c102.run).await.len(), 1, "decided once");
    assert_eq!(server.payments(), [("c-102".to_string(), 25_000)]);
}

#[tokio::test]
async fn dana_lowers_the_amount_and_the_ledger_pays_the_lower_amount() {
    let (server, c102, _driver, dana, item) = dana_reviews("edit", "ben", "c-102").await;

    dana.open_form(&item, "edit").await;
    dana.fill_in(&item, "edit", "input[name=amount]", "300")
        .await;
    let amount = format!("{item} .edit-form input[name=amount]");
    dana.text_containing(
        &format!("{item} .edit-form .field-error"),
        "may only lower the amount",
    )
    .await;
    assert_eq!(
        dana.find(&amount).await.attr("aria-invalid").await.unwrap(),
        Some("true".into())
    );
    assert_eq!(
        server.approval(&c102.approval).await["decisions"],
        json!([]),
        "a raise is never sent"
    );

    dana.type_into(&amount, "200.00").await;
    dana.type_into(
        &format!("{item} .edit-form input[name=note]"),
        "one night at the conference rate",
    )
    .await;
    dana.click(&format!("{item} .edit-submit")).await;
    let status = dana
        .text_containing(
            "#queue-status",
            "You lowered reimburse version 1 to $200.00",
        )
        .await;
    assert!(status.contains("version 2 is approved"), "{status}");
    dana.gone(&item).await;
    dana.close().await;

    assert_eq!(
        server.approval(&c102.approval).await["status"],
        "superseded"
    );
    assert_eq!(server.payments(), [("c-102".to_string(), 20_000)]);
}

#[tokio::test]
async fn an_edit_that_still_needs_a_second_approver_shows_what_changed() {
    let (server, c105, _driver, browser, first) = dana_reviews("edit-waits", "ana", "c-105").await;
    browser.text_containing(&first, "2 of 2 still needed").await;

    browser.open_form(&first, "edit").await;
    browser
        .fill_in(&first, "edit", "input[name=amount]", "600")
        .await;
    browser
        .text_containing("#queue-status", "version 2 waits for 1 more approval")
        .await;
    browser.gone(&first).await;

    let edited = server.approval(&c105.approval).await;
    let second = card(edited["superseded_by"].as_str().unwrap());
    let shown = browser
        .text_containing(&second, "What the edit changed")
        .await;
    for expected in [
        "version 2",
        "dana edited version 1 into version 2",
        "1 of 2 still needed; approved so far: dana",
    ] {
        assert!(
            shown.contains(expected),
            "{expected:?} is not shown:\n{shown}"
        );
    }
    let change = format!("{second} table.changes tr[data-arg=amount_cents]");
    assert_eq!(
        browser.text(&format!("{change} .before")).await,
        "$750.00 (75000 cents)"
    );
    assert_eq!(
        browser.text(&format!("{change} .after")).await,
        "$600.00 (60000 cents)"
    );
    assert!(
        server.payments().is_empty(),
        "nothing is paid on one approval"
    );

    browser.sign_out().await;
    browser.sign_in_as(&server, "erin").await;
    browser
        .decide_card(
            &second,
            "button.approve",
            "You approved reimburse version 2",
        )
        .await;
    browser.close().await;

    assert_eq!(server.payments(), [("c-105".to_string(), 60_000)]);
}

#[tokio::test]
async fn dana_rejects_with_a_reason_and_nothing_is_paid() {
    let (server, c102, _driver, dana, item) = dana_reviews("reject", "ben", "c-102").await;

    dana.click(&format!("{item} details.reject summary")).await;
    dana.click(&format!("{item} .reject-submit")).await;
    dana.text_containing(&format!("{item} .reject-form .field-error"), "Say why")
        .await;
    assert_eq!(
        server.approval(&c102.approval).await["decisions"],
        json!([]),
        "a rejection without a reason is never sent"
    );

    let reason = "The receipt is for a different trip.";
    dana.type_into(&format!("{item} .reject-form textarea"), reason)
        .await;
    dana.click(&format!("{item} .reject-submit")).await;
    dana.gone(&item).await;
    let status = dana
        .text_containing("#queue-status", "You rejected reimburse version 1")
        .await;
    assert!(status.contains(reason), "{status}");
    dana.close().await;

    let decisions = server.decisions(&c102.run).await;
    assert_eq!(decisions.len(), 1);
    assert_eq!(decisions[0]["choice"], "reject");
    assert_eq!(decisions[0]["reason"], reason);
    assert_eq!(server.approval(&c102.approval).await["status"], "rejected");
    assert!(server.payments().is_empty());
}

#[tokio::test]
async fn ben_is_refused_when_he_approves_his_own_claim() {
    let (server, c102, mut driver) = under_review("own-claim", "ben", "c-102").await;
    let before = server.approval(&c102.approval).await;
    let ben = driver.signed_in(&server, "ben").await;
    let item = card(&c102.approval);
    ben.text_containing(&item, "You asked for this").await;

    ben.click(&format!("{item} button.approve")).await;
    let notice = ben
        .text_containing(&format!("{item} .notice"), "own_request")
        .await;
    assert!(notice.starts_with("Refused (own_request)"), "{notice}");
    assert!(notice.contains("ben asked for this"), "{notice}");
    assert_eq!(
        ben.find(&item).await.attr("data-status").await.unwrap(),
        Some("awaiting_approval".into())
    );
    ben.close().await;

    assert_eq!(
        server.approval(&c102.approval).await,
        before,
        "nothing changed"
    );
    assert!(server.decisions(&c102.run).await.is_empty());
    assert!(server.payments().is_empty());
}

#[tokio::test]
async fn a_stale_tab_shows_the_conflict_and_the_approval_as_it_now_stands() {
    let (server, c102, mut driver) = under_review("stale-tab", "ben", "c-102").await;
    let erin = driver.signed_in(&server, "erin").await;
    let dana = driver.signed_in(&server, "dana").await;
    let item = card(&c102.approval);
    erin.find(&item).await;
    dana.find(&item).await;

    erin.click(&format!("{item} button.approve")).await;
    erin.gone(&item).await;

    dana.click(&format!("{item} button.approve")).await;
    let notice = dana
        .text_containing(&format!("{item} .notice"), "Conflict (already_decided)")
        .await;
    assert!(
        notice.contains("Someone else already decided this approval."),
        "{notice}"
    );
    dana.until(
        "the refreshed approval",
        &format!(
            "return document.querySelector({})?.dataset.status === 'approved';",
            json!(item)
        ),
    )
    .await;
    let shown = dana.text(&item).await;
    assert!(shown.contains("erin approved version 1"), "{shown}");
    assert!(shown.contains("Approved"), "{shown}");
    assert_eq!(
        dana.text(&format!("{item} button.approve")).await,
        "",
        "nothing left to decide"
    );
    erin.close().await;
    dana.close().await;

    let decisions = server.decisions(&c102.run).await;
    assert_eq!(decisions.len(), 1, "{decisions:?}");
    assert_eq!(decisions[0]["actor"]["id"], "erin");
    assert_eq!(server.payments(), [("c-102".to_string(), 25_000)]);
}

#[tokio::test]
async fn an_overdue_approval_reads_expired_and_approving_it_expires_it() {
    let server = Server::start_dev("expired");
    let c104 = server.paused_run("chen", "c-104", Some("0s")).await;
    let mut driver = Driver::start().await;
    let dana = driver.signed_in(&server, "dana").await;
    let item = card(&c104.approval);
    dana.text_containing(&format!("{item} .countdown"), "EXPIRED")
        .await;

    dana.click(&format!("{item} button.approve")).await;
    let notice = dana
        .text_containing(&format!("{item} .notice"), "Conflict (expired)")
        .await;
    assert!(notice.contains("the approval has expired"), "{notice}");
    dana.until(
        "the approval to read expired",
        &format!(
            "return document.querySelector({})?.dataset.status === 'expired';",
            json!(item)
        ),
    )
    .await;
    dana.close().await;

    assert_eq!(server.approval(&c104.approval).await["status"], "expired");
    assert!(server.payments().is_empty());
}

#[tokio::test]
async fn a_pasted_token_signs_in_and_the_audit_trail_is_one_click_away() {
    // Without --dev-sign-in: no picker, a pasted token is the way in.
    let server = Server::start("token-audit");
    let c102 = server.paused_run("ben", "c-102", None).await;
    let mut driver = Driver::start().await;
    let erin = driver.browser().await;
    erin.open(&server).await;

    erin.type_into("#token", "not-a-token").await;
    erin.click("#token-sign-in button[type=submit]").await;
    erin.text_containing("#sign-in-error", "Not signed in (invalid_token)")
        .await;
    // By now the page has asked for /dev/people (a 404): the picker stays hidden.
    let picker_hidden = erin
        .client
        .execute(
            "return document.getElementById('dev-sign-in').hidden;",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(
        picker_hidden,
        json!(true),
        "no picker without --dev-sign-in"
    );

    let output = countersign(&server.state)
        .args(["token", "--as", "erin"])
        .output()
        .unwrap();
    assert!(output.status.success());
    let token = String::from_utf8(output.stdout).unwrap();
    erin.type_into("#token", token.trim()).await;
    erin.click("#token-sign-in button[type=submit]").await;
    erin.text_containing(
        "#whoami",
        "Signed in as erin (acme; roles: employee, finance)",
    )
    .await;
    let item = card(&c102.approval);
    erin.click(&format!("{item} button.audit-link")).await;

    let audit = erin
        .text_containing(
            "#audit:not([hidden])",
            &format!("Audit trail of run {}", c102.run),
        )
        .await;
    let stored = server.approval(&c102.approval).await;
    for expected in [
        "awaiting approval",
        stored["explanation"].as_str().unwrap(),
        stored["args_hash"].as_str().unwrap(),
        "amount_cents = $250.00 (25000 cents)",
        "by the agent",
    ] {
        assert!(
            audit.contains(expected),
            "{expected:?} is not shown:\n{audit}"
        );
    }
    let events = erin
        .client
        .execute(
            "return [...document.querySelectorAll('#audit li[data-event]')].map(li => li.dataset.event);",
            vec![],
        )
        .await
        .unwrap();
    let events: Vec<&str> = events
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert_eq!(events.first(), Some(&"started"), "{events:?}");
    assert!(events.contains(&"proposed"), "{events:?}");
    assert_eq!(events.last(), Some(&"paused"), "{events:?}");

    erin.click("#audit-close").await;
    erin.find(&format!("#queue:not([hidden]) {item}")).await;
    erin.close().await;
}

#[tokio::test]
async fn a_notice_link_opens_the_page_on_its_approval_after_sign_in() {
    let server = Server::start_dev("deep-link");
    let c102 = server.paused_run("ben", "c-102", None).await;
    let c104 = server.paused_run("chen", "c-104", None).await;
    let mut driver = Driver::start().await;
    let dana = driver.browser().await;

    // The link a notice carries (`<public URL>/#approval=<id>`), opened before signing in.
    let link = format!("{}/#approval={}", server.base, c104.approval);
    dana.client.goto(&link).await.unwrap();
    // Without the secret the page knows nobody; typed in, it lists the people.
    dana.find("#dev-sign-in:not([hidden]) #dev-secret").await;
    let listed = "return document.querySelectorAll('#dev-person option').length;";
    assert_eq!(dana.client.execute(listed, vec![]).await.unwrap(), json!(0));
    dana.type_into("#dev-secret", &server.dev_secret()).await;
    dana.find("#dev-person option[value=dana]").await;
    let picker = dana.find("#dev-sign-in:not([hidden]) #dev-person").await;
    picker.select_by_value("dana").await.unwrap();
    dana.click("#dev-sign-in button[type=submit]").await;

    let linked = format!("{}.linked[aria-current=true]", card(&c104.approval));
    dana.text_containing(&linked, "The approval your link opened")
        .await;
    let script = format!(
        "return document.querySelectorAll('.linked').length === 1 \
         && document.activeElement.dataset.approvalId === {};",
        json!(c104.approval)
    );
    dana.until(
        "the linked approval alone to be selected and focused",
        &script,
    )
    .await;
    let other = dana.find(&card(&c102.approval)).await;
    assert_eq!(other.attr("aria-current").await.unwrap(), None);
    let address = dana.client.current_url().await.unwrap();
    assert_eq!(
        address.fragment(),
        Some(format!("approval={}", c104.approval).as_str()),
        "the link stays in the address bar, so a reload selects it again"
    );

    // Decided elsewhere: the link still shows the approval, as it now stands.
    let reply = server
        .decide(
            "erin",
            &c104.approval,
            json!({"decision_id": "d-link", "action_version": 1, "choice": "approve"}),
        )
        .await;
    assert_eq!(reply.status, 200, "{:?}", reply.json);
    dana.client.refresh().await.unwrap();
    let shown = dana
        .text_containing(&linked, "it no longer waits for a decision")
        .await;
    assert!(shown.contains("Approved"), "{shown}");
    dana.find(&format!("{} button.dismiss", card(&c104.approval)))
        .await;
    dana.close().await;
}

#[tokio::test]
async fn a_comment_round_trip_asks_the_requester_and_decides_nothing() {
    let (server, c102, mut driver) = under_review("comment", "ben", "c-102").await;
    let browser = driver.browser().await;
    let item = card(&c102.approval);

    browser.sign_in_as(&server, "dana").await;
    browser.open_form(&item, "comment").await;
    // An empty comment is refused in the page, before any request.
    browser.click(&format!("{item} .comment-submit")).await;
    browser
        .text_containing(
            &format!("{item} .comment-form .field-error"),
            "Write the comment first.",
        )
        .await;
    browser
        .fill_in(
            &item,
            "comment",
            "textarea",
            "Is the hotel receipt attached?",
        )
        .await;
    browser
        .text_containing(
            "#queue-status",
            "Your comment on reimburse version 1 is added.",
        )
        .await;
    let shown = browser
        .text_containing(
            &format!("{item} .comments"),
            "Is the hotel receipt attached?",
        )
        .await;
    assert!(shown.contains("dana"), "{shown}");
    browser.sign_out().await;

    // The requester reads it and answers in a comment of his own; still nobody decided.
    browser.sign_in_as(&server, "ben").await;
    browser
        .text_containing(
            &format!("{item} .comments"),
            "Is the hotel receipt attached?",
        )
        .await;
    browser.open_form(&item, "comment").await;
    browser
        .fill_in(&item, "comment", "textarea", "Yes, page 2.")
        .await;
    browser
        .text_containing(&format!("{item} .comments"), "Yes, page 2.")
        .await;

    let stored = server.approval(&c102.approval).await;
    assert_eq!(stored["status"], "awaiting_approval");
    assert_eq!(stored["decisions"], json!([]));
    let comments: Vec<(&str, &str)> = stored["comments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["by"].as_str().unwrap(), c["text"].as_str().unwrap()))
        .collect();
    assert_eq!(
        comments,
        [
            ("dana", "Is the hotel receipt attached?"),
            ("ben", "Yes, page 2.")
        ]
    );

    // Both are in the audit trail, in order.
    browser.click(&format!("{item} button.audit-link")).await;
    browser.text_containing("#audit-body", "Yes, page 2.").await;
    let events = browser
        .client
        .execute(
            "return [...document.querySelectorAll('#audit-body li[data-event=commented]')].map(li => li.innerText);",
            vec![],
        )
        .await
        .unwrap();
    let events = events.as_array().unwrap();
    assert_eq!(events.len(), 2, "{events:?}");
    assert!(
        events[0].as_str().unwrap().contains("by dana"),
        "{events:?}"
    );
    assert!(events[1].as_str().unwrap().contains("by ben"), "{events:?}");
    browser.close().await;
}

/// The refunds agent without its reconcile request, in a directory of the test's own: an
/// unknown outcome of its refund can only be settled by its recovery owner.
fn refunds_without_reconcile(name: &str) -> PathBuf {
    let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/agents/refunds");
    let dir = fresh_path(name).join("refunds");
    std::fs::create_dir_all(&dir).unwrap();
    for file in ["policy.toml", "script.toml"] {
        std::fs::copy(format!("{shipped}/{file}"), dir.join(file)).unwrap();
    }
    let agent = std::fs::read_to_string(format!("{shipped}/agent.toml")).unwrap();
    let cut = agent
        .find("[tools.issue_refund.http.reconcile]")
        .expect("the shipped refunds agent has a reconcile request");
    let without = agent[..cut].trim_end().to_string();
    assert!(!without.contains("reconcile]"), "{without}");
    std::fs::write(dir.join("agent.toml"), without + "\n").unwrap();
    dir
}

#[tokio::test]
async fn a_recovery_owner_answers_an_unknown_refund_in_the_page_and_the_run_ends_with_one_refund() {
    // The orders service commits the refund, then answers 500: nobody can tell it took effect.
    let orders = common::orders::OrdersService::start_with(
        "browser-recovery",
        &["--fault", "commit-then-500"],
    );
    let agent = refunds_without_reconcile("browser-recovery-agent");
    let server = Server::start_with_env(
        "recovery",
        &[
            "--sweep-every",
            "0s",
            "--dev-sign-in",
            "--agents",
            agent.to_str().unwrap(),
        ],
        &orders.env(),
    );
    let started = server
        .start_agent(
            "ben",
            "refunds",
            "Refund ord_55: the blender arrived damaged.",
        )
        .await;
    assert_eq!(started.status, 200, "{}", started.json);
    let run = started.json["run_id"].as_str().unwrap().to_string();
    let approval = started.json["approvals"][0]["id"].as_str().unwrap();
    server
        .decided(
            "mia",
            approval,
            json!({"decision_id": "d-refund", "action_version": 1, "choice": "approve"}),
        )
        .await;
    assert_eq!(
        orders.refunds("ord_55").len(),
        1,
        "the refund was committed"
    );

    let mut driver = Driver::start().await;
    let mia = driver.signed_in(&server, "mia").await;
    let listed = server.get("/approvals", "mia").await;
    let recovery = listed.json["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["kind"] == "recovery")
        .unwrap_or_else(|| panic!("a recovery waits for mia: {}", listed.json))["id"]
        .as_str()
        .unwrap()
        .to_string();
    let item = card(&recovery);
    // A recovery is answered, not approved, edited or rejected.
    mia.find(&format!("{item} button.took-effect")).await;
    mia.find(&format!("{item} button.did-not-take-effect"))
        .await;
    for absent in ["button.approve", "details.edit", "details.reject"] {
        let found = mia
            .client
            .find_all(Locator::Css(&format!("{item} {absent}")))
            .await
            .unwrap();
        assert!(found.is_empty(), "a recovery card offers no {absent}");
    }

    let said = mia
        .decide_card(&item, "button.took-effect", "took effect; the run goes on")
        .await;
    assert!(said.contains("The run is done"), "{said}");

    // The answer is mia's, in the audit, and the refund was made once.
    assert_eq!(orders.refunds("ord_55").len(), 1);
    let audit = server.audit(&run).await;
    let entries = audit["entries"].as_array().unwrap();
    let reconciled = entries
        .iter()
        .find(|e| e["event"] == "reconciled")
        .unwrap_or_else(|| panic!("a reconciled entry: {audit}"));
    assert_eq!(reconciled["actor"]["id"], "mia", "{reconciled}");
    assert_eq!(audit["run"]["status"], "done", "{audit}");
    mia.close().await;
}

#[tokio::test]
async fn each_card_names_its_agent_and_task_and_what_was_decided_shows_who_decided_and_how_the_call_ended()
 {
    // Two agents share one review list: ben's expense claim and sam's refund.
    let (server, c102, mut driver) = under_review("decided", "ben", "c-102").await;
    let task = "Refund USD 125 for order ord_55: the blender arrived damaged.";
    let refund = server.start_agent("sam", "refunds", task).await;
    assert_eq!(refund.status, 200, "{}", refund.json);
    let refund = card(refund.json["approvals"][0]["id"].as_str().unwrap());
    let dana = driver.signed_in(&server, "dana").await;
    let item = card(&c102.approval);

    let claim = dana
        .text_containing(&format!("{item} .task"), "Process expense claim c-102.")
        .await;
    assert_eq!(claim, "Process expense claim c-102.");
    assert_eq!(dana.text(&format!("{item} .agent")).await, "expense");
    assert_eq!(dana.text(&format!("{refund} .task")).await, task);
    assert_eq!(dana.text(&format!("{refund} .agent")).await, "refunds");
    dana.text_containing(
        "#decided-section",
        "Nothing was decided in your organisation yet.",
    )
    .await;

    // When dana approves the claim, it leaves the queue for the recently decided list.
    dana.decide_card(&item, "button.approve", "You approved reimburse version 1")
        .await;

    let decided = format!("[data-decided-id=\"{}\"]", c102.approval);
    let shown = dana
        .text_containing(&decided, "dana approved version 1")
        .await;
    for expected in [
        "Approved",
        "expense",
        "Process expense claim c-102.",
        "Version 1 succeeded",
    ] {
        assert!(
            shown.contains(expected),
            "{expected:?} is not shown:\n{shown}"
        );
    }
    assert!(
        shown.contains("$250.00"),
        "what the call came back with:\n{shown}"
    );
    dana.close().await;

    // Then erin, arriving later (from a notice's link, say), reads who decided it and how it
    // ended, and its audit trail is one click away.
    let erin = driver.signed_in(&server, "erin").await;
    erin.text_containing(&decided, "dana approved version 1")
        .await;
    erin.click(&format!("{decided} button.audit-link")).await;
    let audit = erin
        .text_containing(
            "#audit:not([hidden])",
            &format!("Audit trail of run {}", c102.run),
        )
        .await;
    assert!(audit.contains("done"), "{audit}");
    erin.close().await;
    assert_eq!(server.payments(), [("c-102".to_string(), 25_000)]);
}

#[tokio::test]
async fn a_queue_longer_than_a_page_shows_more_on_a_click_and_keeps_it_shown_after_a_decision() {
    let server = Server::start_dev("more");
    // One more than a page (50): ben's calls through the gate, each waiting on finance.
    let mut approvals = Vec::new();
    for n in 0..51 {
        let call = json!({"agent": "expense", "tool": "reimburse", "call_id": format!("call-{n}"),
                          "args": {"claim_id": "c-102", "amount_cents": 10_000 + n}});
        let proposed = server.post("/gate/calls", "ben", call).await;
        assert_eq!(proposed.status, 202, "{}", proposed.json);
        approvals.push(
            proposed.json["approval"]["id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    let mut driver = Driver::start().await;
    let dana = driver.signed_in(&server, "dana").await;
    let shown = |count: usize| {
        format!("return document.querySelectorAll('#approvals > li').length === {count};")
    };
    dana.until("a page of 50 cards", &shown(50)).await;
    dana.find(&card(&approvals[0])).await;
    let last = card(&approvals[50]);
    assert_eq!(dana.text(&last).await, "", "the 51st is on the next page");

    dana.click("#more:not([hidden])").await;

    dana.until("51 cards", &shown(51)).await;
    dana.find(&last).await;
    dana.text_containing("#queue-status", "1 more shown.").await;
    dana.find("#more[hidden]").await;
    let focused = "return document.activeElement && \
        document.activeElement.closest('[data-approval-id]').dataset.approvalId;";
    assert_eq!(
        dana.until("focus on the card added", focused).await,
        approvals[50]
    );

    // A decision reads the queue again: both pages of it, less the one decided.
    dana.decide_card(
        &card(&approvals[0]),
        "button.approve",
        "You approved reimburse version 1",
    )
    .await;
    dana.until("50 cards after the decision", &shown(50)).await;
    dana.find(&last).await;
    dana.find("#more[hidden]").await;
    dana.close().await;
}

/// The shipped claude-code agent's directory, and its people file.
fn claude_code() -> (&'static str, String) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/claude-code");
    (dir, format!("{dir}/people.toml"))
}

#[tokio::test]
async fn on_a_phone_a_long_command_fits_the_screen_wraps_and_its_approve_and_reject_are_big_enough_to_tap()
 {
    let (agent, people) = claude_code();
    let server = Server::start_with(
        "phone",
        &[
            "--sweep-every",
            "0s",
            "--dev-sign-in",
            "--agents",
            agent,
            "--people",
            &people,
        ],
    );
    // Claude Code's identity proposes a long command, with a word longer than the screen.
    let directory = Directory::from_toml(&std::fs::read_to_string(&people).unwrap()).unwrap();
    let dev_bot = server.forged_token(
        directory.identify("dev-bot").unwrap(),
        chrono::Duration::zero(),
        Duration::from_secs(600),
    );
    let command = format!(
        "rm -rf build/{} && curl -fsS https://deploy.example.com/hooks/{}",
        "generated-artifacts-".repeat(8),
        "0123456789abcdef".repeat(6)
    );
    let call = json!({"agent": "claude-code", "tool": "Bash", "call_id": "toolu_01Phone",
                      "args": {"command": command, "description": "Clean and redeploy"}});
    let proposed = server
        .send(
            reqwest::Method::POST,
            "/gate/calls",
            Some(dev_bot),
            Some(("application/json", call.to_string().into_bytes())),
        )
        .await;
    assert_eq!(proposed.status, 202, "{}", proposed.json);
    let item = card(proposed.json["approval"]["id"].as_str().unwrap());

    let mut driver = Driver::start().await;
    let lin = driver.phone().await;
    lin.sign_in_as(&server, "lin").await;
    lin.text_containing(&format!("{item} [data-arg=command]"), "deploy.example.com")
        .await;

    let (width, _) = PHONE;
    let layout = format!(
        "const box = (css) => document.querySelector({item} + ' ' + css).getBoundingClientRect(); \
         const line = parseFloat(getComputedStyle(document.querySelector({item} + ' [data-arg=command] td')).lineHeight); \
         return {{ viewport: window.innerWidth, scroll: document.documentElement.scrollWidth, \
                  approve: box('button.approve').toJSON(), reject: box('details.reject summary').toJSON(), \
                  command: box('[data-arg=command] td').toJSON(), line }};",
        item = json!(item)
    );
    let shown = lin.client.execute(&layout, vec![]).await.unwrap();
    assert_eq!(
        shown["viewport"], width,
        "the page is laid out for the phone: {shown}"
    );
    assert!(
        shown["scroll"].as_f64().unwrap() <= f64::from(width),
        "nothing overflows sideways: {shown}"
    );
    for button in ["approve", "reject"] {
        let target = &shown[button];
        assert!(
            target["height"].as_f64().unwrap() >= TAP_TARGET,
            "{button} is at least {TAP_TARGET} px tall: {shown}"
        );
        assert!(
            target["left"].as_f64().unwrap() >= 0.0
                && target["right"].as_f64().unwrap() <= f64::from(width),
            "{button} is on the screen: {shown}"
        );
    }
    let command = &shown["command"];
    assert!(
        command["right"].as_f64().unwrap() <= f64::from(width),
        "the command stays on the screen: {shown}"
    );
    assert!(
        command["height"].as_f64().unwrap() > 3.0 * shown["line"].as_f64().unwrap(),
        "the command wraps onto several lines: {shown}"
    );
    lin.close().await;
}
