"""Markers of the editor tests."""


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "vscode: the VS Code extension in code-server driven by headless Chromium "
        "(skips without Node 24, code-server, playwright-core or Chromium: tests/editors/vscode_e2e_setup.sh)",
    )
