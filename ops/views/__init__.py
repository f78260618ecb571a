"""The operator's views of a run (`python -m ops run|runs|compare|streams|tail|dlq|verdicts|samples|theorem|open|
dashboard`): what they read (inspect, dlq, verdicts, judged, runs, compare), how they draw it (text,
dashboard) and how a finished local run is opened for them (finished)."""
