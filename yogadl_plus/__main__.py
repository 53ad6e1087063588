from yogadl_plus.cli import main

raise SystemExit(main())
