"""Driving the app's page in Debian's headless chromium (selenium + chromium-driver, no browser download): shared by
tests/test_app_browser.py and bench/bench_app.py."""

from __future__ import annotations

import shutil
import time

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM = ("chromium", "chromium-browser")
DRIVER = "chromedriver"


def missing_browser() -> str | None:
    """Why the browser cannot run here (None when it can)."""
    if not any(shutil.which(name) for name in CHROMIUM):
        return "no chromium (apt-get install -y chromium chromium-driver)"
    if not shutil.which(DRIVER):
        return "no chromedriver (apt-get install -y chromium-driver)"
    return None


class Page:
    """The app's page in a headless chromium: actions and what is on screen."""

    def __init__(self, url: str, width: int = 1280, height: int = 1500, timeout: float = 60):
        options = webdriver.ChromeOptions()
        for argument in (
            "--headless=new",
            "--no-sandbox",
            "--disable-dev-shm-usage",
            "--disable-gpu",
            f"--window-size={width},{height}",
        ):
            options.add_argument(argument)
        options.binary_location = next(shutil.which(name) for name in CHROMIUM if shutil.which(name))
        self.driver = webdriver.Chrome(service=Service(shutil.which(DRIVER)), options=options)
        self.timeout = timeout
        self.driver.get(url)
        self.wait_for(lambda: self.driver.find_elements(By.CSS_SELECTOR, "#image-input input[type=file]"))

    def close(self) -> None:
        self.driver.quit()

    def wait_for(self, condition, timeout: float | None = None):
        return WebDriverWait(self.driver, timeout or self.timeout, poll_frequency=0.02).until(lambda _: condition())

    def text(self, element_id: str) -> str:
        """The text an element shows, without Gradio's progress overlay ("processing | 0.7s")."""
        return self.driver.execute_script(
            "const copy = document.getElementById(arguments[0]).cloneNode(true);"
            "copy.querySelectorAll('[data-testid=status-tracker]').forEach(e => e.remove());"
            "return copy.innerText.trim();",
            element_id,
        )

    def screenshot(self, path) -> None:
        self.driver.save_screenshot(str(path))

    # -- actions --------------------------------------------------------------------------------------------------
    def upload(self, path) -> None:
        self.driver.find_element(By.CSS_SELECTOR, "#image-input input[type=file]").send_keys(str(path))

    def clear_upload(self) -> None:
        """Remove the current upload (the file box's clear button), so that the next upload is a new value."""
        buttons = self.driver.find_elements(By.CSS_SELECTOR, "#image-input button[aria-label='Clear']")
        if buttons:
            buttons[0].click()
            self.wait_for(lambda: self.driver.find_elements(By.CSS_SELECTOR, "#image-input input[type=file]"))

    def pick_model(self, name: str) -> None:
        box = self.driver.find_element(By.CSS_SELECTOR, "#model input")
        box.click()
        option = self.wait_for(
            lambda: self.driver.find_elements(By.CSS_SELECTOR, f"li[role=option][aria-label='{name}']")
        )
        option[0].click()
        self.wait_for(lambda: box.get_attribute("value") == name)

    def tab(self, label: str) -> None:
        [button] = [b for b in self.driver.find_elements(By.CSS_SELECTOR, "button[role=tab]") if b.text == label]
        button.click()

    def fill(self, element_id: str, text: str) -> None:
        box = self.driver.find_element(By.CSS_SELECTOR, f"#{element_id} textarea, #{element_id} input")
        box.send_keys(Keys.CONTROL, "a")
        box.send_keys(Keys.DELETE)
        box.send_keys(text)

    def click(self, element_id: str) -> None:
        self.driver.find_element(By.ID, element_id).click()

    def status_after(self, action, timeout: float | None = None) -> tuple[str, float]:
        """Run `action` and wait until the status line changes: (the new status, seconds from the action to it)."""
        before = self.text("status")
        start = time.perf_counter()
        action()
        status = self.wait_for(lambda: (self.text("status") != before and self.text("status")) or None, timeout)
        return status, time.perf_counter() - start

    # -- what is on screen ----------------------------------------------------------------------------------------
    def answers(self, element_id: str = "answers") -> list[tuple[str, str]]:
        """The labels shown with their percentages, best first (the answers, or the ranking)."""
        rows = self.driver.find_elements(By.CSS_SELECTOR, f"#{element_id} .confidence-set")
        return [
            (r.find_element(By.CSS_SELECTOR, ".text").text, r.find_element(By.CSS_SELECTOR, ".confidence").text)
            for r in rows
        ]

    def caption(self) -> str:
        return self.driver.find_element(By.CSS_SELECTOR, "#caption textarea").get_attribute("value")
