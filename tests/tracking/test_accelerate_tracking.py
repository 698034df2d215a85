"""What scripts written for Accelerate observe of a custom tracker (issue 17's findings of the peer suite;
each test asserts what such a script observes)."""

from __future__ import annotations

from drivetrain import Accelerator


def test_custom_tracker_is_started_before_configuration_and_logs(tmp_path):
    from drivetrain.tracking import GeneralTracker

    class ListTracker(GeneralTracker):
        name = "list_tracker"
        requires_logging_directory = False

        def __init__(self):
            super().__init__()
            self.writer = None

        def start(self):
            self.writer = []

        @property
        def tracker(self):
            return self.writer

        def store_init_configuration(self, values):
            self.writer.append(("config", values))

        def log(self, values, step=None, **kwargs):
            self.writer.append(("log", values, step))

    tracker = ListTracker()
    accelerator = Accelerator(cpu=True, log_with=tracker)
    accelerator.init_trackers("run", {"lr": 0.1})
    accelerator.log({"loss": 1.0}, step=3)
    accelerator.end_training()
    assert tracker.writer == [("config", {"lr": 0.1}), ("log", {"loss": 1.0}, 3)]
