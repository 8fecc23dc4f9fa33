//! The page around the canvas: URL parameters, the plain-text message shown when the demo cannot
//! run, the JSON report the browser test reads, and a timer to yield to the browser.

use wasm_bindgen::JsCast;

fn document() -> Option<web_sys::Document> {
    web_sys::window()?.document()
}

/// The URL's `?name=value`, if given.
pub fn param(name: &str) -> Option<String> {
    let search = web_sys::window()?.location().search().ok()?;
    web_sys::UrlSearchParams::new_with_str(&search).ok()?.get(name)
}

/// Whether the browser exposes WebGPU at all (`navigator.gpu`).
pub fn has_webgpu() -> bool {
    web_sys::window().is_some_and(|w| {
        js_sys::Reflect::get(&w.navigator(), &"gpu".into()).is_ok_and(|g| !g.is_undefined() && !g.is_null())
    })
}

/// Shows `text` in the page's message line (visible above the canvas).
pub fn message(text: &str) {
    if let Some(el) = document().and_then(|d| d.get_element_by_id("pagetrain-message")) {
        el.set_text_content(Some(text));
        if let Ok(el) = el.dyn_into::<web_sys::HtmlElement>() {
            let _ = el.style().set_property("display", "block");
        }
    }
}

/// Writes the run's report (JSON) where the browser test reads it.
pub fn report(json: &str) {
    if let Some(el) = document().and_then(|d| d.get_element_by_id("pagetrain-report")) {
        el.set_text_content(Some(json));
    }
}

pub fn canvas(id: &str) -> Result<web_sys::HtmlCanvasElement, String> {
    document()
        .and_then(|d| d.get_element_by_id(id))
        .and_then(|e| e.dyn_into::<web_sys::HtmlCanvasElement>().ok())
        .ok_or_else(|| format!("the page has no canvas #{id}"))
}

/// Resolves after `ms` milliseconds, letting the browser draw and run callbacks meanwhile.
pub async fn sleep(ms: i32) {
    let promise = js_sys::Promise::new(&mut |resolve, _| {
        if let Some(w) = web_sys::window() {
            let _ = w.set_timeout_with_callback_and_timeout_and_arguments_0(&resolve, ms);
        }
    });
    let _ = wasm_bindgen_futures::JsFuture::from(promise).await;
}
