"""What a task is, with no Redis in sight: the task model and its validation, schedules
(interval, cron, once; misfire policy), the name pattern and enums defined once, and the
typed errors every layer raises.

May import: ``runtime.config`` (name checks, the strict converter). Nothing else of the
project.
"""
